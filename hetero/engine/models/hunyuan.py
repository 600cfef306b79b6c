"""Hunyuan V1 dense (Tencent): Qwen3's attention with its per-head q/k RMSNorms named
``query_layernorm`` / ``key_layernorm`` and applied after rope, not before; rope "dynamic" with
``alpha`` is a fixed NTK-alpha table (``layers/rotary.py``). The rest is the shared decoder."""

from __future__ import annotations

from typing import Any

from hetero.engine.context import ModelContext
from hetero.engine.layers.gqa import head_dim_of
from hetero.engine.layers.rotary import RotaryEmbedding
from hetero.engine.models.decoder import DecoderForCausalLM, DecoderLayer
from hetero.engine.models.qwen3 import Qwen3Attention

__all__ = ["HunYuanDenseV1Attention", "HunYuanDenseV1DecoderLayer", "HunYuanDenseV1ForCausalLM"]


class HunYuanDenseV1Attention(Qwen3Attention):
    norm_names = ("query_layernorm", "key_layernorm")
    norms_after_rope = True


class HunYuanDenseV1DecoderLayer(DecoderLayer):
    attention_cls = HunYuanDenseV1Attention

    @classmethod
    def rotary_table(cls, ctx: ModelContext, config: Any) -> RotaryEmbedding:
        """NeoX pairs over the whole head; "dynamic" with ``alpha`` is the fixed NTK-alpha table."""
        return RotaryEmbedding(ctx, config, head_dim_of(config), config.max_position_embeddings, ntk_alpha=True)


class HunYuanDenseV1ForCausalLM(DecoderForCausalLM):
    """Hunyuan V1 dense models (0.5B-7B, HunyuanOCR's text backbone); Qwen-style parameter names."""

    layer_cls = HunYuanDenseV1DecoderLayer
