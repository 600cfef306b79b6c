"""Hunyuan V1 dense (Tencent): GQA attention whose per-head q/k RMSNorms (``query_layernorm`` /
``key_layernorm``) come after rope, not before as in Qwen3; rope "dynamic" with ``alpha`` is a fixed
NTK-alpha table (``layers/rotary.py``). The rest is the shared decoder."""

from __future__ import annotations

from typing import Any

import torch

from hetero.engine.context import ModelContext
from hetero.engine.layers.gqa import GQAttention, head_dim_of
from hetero.engine.layers.norm import RMSNorm
from hetero.engine.layers.rotary import RotaryEmbedding
from hetero.engine.layers.weights import join_prefix
from hetero.engine.models.decoder import DecoderForCausalLM, DecoderLayer
from hetero.engine.quant.config import QuantConfig

__all__ = ["HunYuanDenseV1Attention", "HunYuanDenseV1DecoderLayer", "HunYuanDenseV1ForCausalLM"]


class HunYuanDenseV1Attention(GQAttention):
    """GQA attention plus ``query_layernorm`` / ``key_layernorm`` over head_dim, applied after rope."""

    def __init__(
        self,
        ctx: ModelContext,
        config: Any,
        layer_idx: int,
        rotary: RotaryEmbedding,
        *,
        prefix: str = "",
        quant_config: QuantConfig | None = None,
    ):
        super().__init__(ctx, config, layer_idx, rotary, prefix=prefix, quant_config=quant_config)
        eps = config.rms_norm_eps
        self.query_layernorm = RMSNorm(ctx, self.head_dim, eps, prefix=join_prefix(prefix, "query_layernorm"))
        self.key_layernorm = RMSNorm(ctx, self.head_dim, eps, prefix=join_prefix(prefix, "key_layernorm"))

    def qk_after_rope(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.query_layernorm(q), self.key_layernorm(k)


class HunYuanDenseV1DecoderLayer(DecoderLayer):
    attention_cls = HunYuanDenseV1Attention

    @classmethod
    def rotary_table(cls, ctx: ModelContext, config: Any) -> RotaryEmbedding:
        """NeoX pairs over the whole head; "dynamic" with ``alpha`` is the fixed NTK-alpha table."""
        return RotaryEmbedding(ctx, config, head_dim_of(config), config.max_position_embeddings, ntk_alpha=True)


class HunYuanDenseV1ForCausalLM(DecoderForCausalLM):
    """Hunyuan V1 dense models (0.5B-7B, HunyuanOCR's text backbone); Qwen-style parameter names."""

    layer_cls = HunYuanDenseV1DecoderLayer
