"""Full attention with an output gate and zero-centred norms (the attention layers of Qwen3-Next and Qwen3.5).

``q_proj`` emits 2*D per head, the query then its gate; q and k get a per-head RMSNorm with
a zero-centred weight (``norm(x) * (1 + w)``), NeoX rope on the first ``rotary_dim`` dims
(``partial_rotary_factor`` of head_dim), paged attention, and ``o * sigmoid(gate)`` before
``o_proj``. The decoder norms of these models are zero-centred too (``ZeroCenteredRMSNorm``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.attention import Attention
from hetero.engine.layers.linear import QKVParallelLinear, RowParallelLinear
from hetero.engine.layers.norm import RMSNorm
from hetero.engine.layers.rotary import RotaryEmbedding
from hetero.engine.layers.weights import join_prefix
from hetero.engine.parallel import divide
from hetero.engine.quant.config import QuantConfig
from hetero.engine.step import Step

__all__ = ["GatedAttention", "ZeroCenteredRMSNorm", "rotary_dim_of"]


def rotary_dim_of(config: Any, head_dim: int) -> int:
    """The rotated dims of each head: ``partial_rotary_factor`` (in ``rope_parameters``, as transformers 5
    keeps it, or on the config) times ``head_dim``; 1.0 when neither has it."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    factor = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    return int(head_dim * (1.0 if factor is None else float(factor)))


class ZeroCenteredRMSNorm(RMSNorm):
    """RMSNorm whose checkpoint weight w is stored zero-centred: ``norm(x) * (1 + w)``, the sum in float32
    (``rms_norm(weight_offset=1.0)``), as the Qwen3-Next / Qwen3.5 norms compute it."""

    def __init__(self, ctx: ModelContext, hidden: int, eps: float, *, prefix: str = ""):
        super().__init__(ctx, hidden, eps, prefix=prefix, weight_offset=1.0)


class GatedAttention(nn.Module):
    """``forward(hidden [T, H], step) -> [T, H]``; heads split over ranks.

    Parameters: ``qkv_proj`` (q_proj [2*H*D] packed with k_proj, v_proj), ``q_norm``, ``k_norm``
    (zero-centred, over D), ``o_proj``; q/k/v/o biases when ``attention_bias``. Built like every
    decoder token mixer (``models/decoder.py``); every layer is alike, so ``layer_idx`` is not used.
    """

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
        super().__init__()
        self.prefix = prefix
        heads, d = config.num_attention_heads, config.head_dim
        divide(heads, ctx.parallel.size, "attention heads")
        bias = bool(getattr(config, "attention_bias", False))
        # q_proj's rows are [q (D) | gate (D)] per head: as 2*H "heads" of D, each rank's share is whole pairs
        self.qkv_proj = QKVParallelLinear(
            ctx,
            config.hidden_size,
            d,
            2 * heads,
            config.num_key_value_heads,
            bias=bias,
            prefix=join_prefix(prefix, "qkv_proj"),
            quant_config=quant_config,
        )
        self.head_dim, self.num_heads = d, self.qkv_proj.num_heads // 2
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.num_heads * d, self.num_kv_heads * d
        self.o_proj = RowParallelLinear(
            ctx,
            heads * d,
            config.hidden_size,
            bias=bias,
            prefix=join_prefix(prefix, "o_proj"),
            quant_config=quant_config,
        )
        self.q_norm = ZeroCenteredRMSNorm(ctx, d, config.rms_norm_eps, prefix=join_prefix(prefix, "q_norm"))
        self.k_norm = ZeroCenteredRMSNorm(ctx, d, config.rms_norm_eps, prefix=join_prefix(prefix, "k_norm"))
        self.rotary_emb = rotary
        self.attn = Attention(
            ctx, self.num_heads, self.num_kv_heads, d, d**-0.5, kv_heads=self.qkv_proj.kv_heads_held()
        )

    def forward(self, hidden: torch.Tensor, step: Step) -> torch.Tensor:
        tokens = hidden.shape[0]
        qg, k, v = self.qkv_proj(hidden).split([2 * self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, gate = qg.reshape(tokens, self.num_heads, 2, self.head_dim).unbind(2)
        q = self.q_norm(q.contiguous())
        k = self.k_norm(k.reshape(tokens, self.num_kv_heads, self.head_dim))
        q, k = self.rotary_emb(step.positions, q, k)
        out = self.attn(q, k, v.reshape(tokens, self.num_kv_heads, self.head_dim), step)
        out = out * torch.sigmoid(gate)
        return self.o_proj(out.reshape(tokens, self.q_size))
