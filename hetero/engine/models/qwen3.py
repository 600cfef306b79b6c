"""Qwen3: GQA attention with per-head q/k RMSNorm before rope, an explicit head_dim and
q/k/v/o bias only when ``attention_bias``."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from hetero.engine.context import ModelContext
from hetero.engine.layers.gqa import GQAttention
from hetero.engine.layers.norm import RMSNorm
from hetero.engine.layers.rotary import RotaryEmbedding
from hetero.engine.layers.weights import join_prefix
from hetero.engine.models.decoder import DecoderForCausalLM, DecoderLayer
from hetero.engine.quant.config import QuantConfig

__all__ = ["Qwen3Attention", "Qwen3DecoderLayer", "Qwen3ForCausalLM"]


class Qwen3Attention(GQAttention):
    """GQA attention plus per-head q/k RMSNorms over head_dim (one weight shared by all heads), named
    ``norm_names`` in the checkpoint and applied before rope, or after it where ``norms_after_rope``
    (Hunyuan)."""

    norm_names: ClassVar[tuple[str, str]] = ("q_norm", "k_norm")
    norms_after_rope: ClassVar[bool] = False

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
        for name in self.norm_names:
            setattr(self, name, RMSNorm(ctx, self.head_dim, config.rms_norm_eps, prefix=join_prefix(prefix, name)))

    def _norms(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q_name, k_name = self.norm_names
        return getattr(self, q_name)(q), getattr(self, k_name)(k)

    def qk_transform(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (q, k) if self.norms_after_rope else self._norms(q, k)

    def qk_after_rope(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._norms(q, k) if self.norms_after_rope else (q, k)


class Qwen3DecoderLayer(DecoderLayer):
    attention_cls = Qwen3Attention


class Qwen3ForCausalLM(DecoderForCausalLM):
    """Qwen3 dense models; same parameter names and weight mapping as Qwen2 plus q_norm / k_norm."""

    layer_cls = Qwen3DecoderLayer
