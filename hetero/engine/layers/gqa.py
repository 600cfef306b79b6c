"""Grouped-query attention, the token mixer of most decoders: q/k/v projections, rope, paged attention, o_proj.

It is the ``attention_cls`` of the GQA families (``models/qwen2.py``, ``qwen3.py``, ``gpt_oss.py``); a family
changes what its architecture changes by overriding ``biases`` (which projections have a bias),
``qk_transform`` (e.g. Qwen3's per-head q/k norms), ``with_sinks`` (gpt-oss's sink logits), or
``kv_heads`` / ``value_head_dim`` / ``v_transform`` (MiMo-V2-Flash's per-layer KV heads, Dv < D, scaled V).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.attention import Attention
from hetero.engine.layers.linear import QKVParallelLinear, RowParallelLinear
from hetero.engine.layers.rotary import RotaryEmbedding
from hetero.engine.layers.weights import join_prefix
from hetero.engine.quant.config import QuantConfig
from hetero.engine.step import Step

__all__ = ["GQAttention", "head_dim_of", "sliding_window_of"]


def head_dim_of(config: Any) -> int:
    """The explicit ``head_dim`` of the config, else hidden_size / num_attention_heads."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def sliding_window_of(config: Any, layer_idx: int) -> tuple[int, int]:
    """The ``window`` of layer ``layer_idx`` for ``paged_attention``, as transformers masks it.

    transformers keeps key j for query i iff ``j > i - sliding_window``, i.e.
    ``i - (sliding_window - 1) <= j``. With ``layer_types`` (Qwen2, Qwen3, gpt-oss) only
    "sliding_attention" layers slide; without it (Qwen3-MoE) every layer does when
    ``sliding_window`` is set (the config clears it unless ``use_sliding_window``).
    """
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types is not None and types[layer_idx] != "sliding_attention":
        return (-1, -1)
    if not window:
        return (-1, -1)
    return (int(window) - 1, -1)


class GQAttention(nn.Module):
    """qkv_proj -> ``qk_transform`` -> rope -> paged attention -> o_proj, heads split over ranks.

    A decoder token mixer (``models/decoder.py``): built ``(ctx, config, layer_idx, rotary, *, prefix,
    quant_config)``, called ``(hidden [T, H], step) -> [T, H]``; rope at ``step.positions``, scale
    ``head_dim ** -0.5``, the layer's sliding window (``sliding_window_of``). With ``with_sinks`` the
    attention takes per-head sink logits, ``self.sinks`` (a subclass makes it a Parameter).
    """

    with_sinks: ClassVar[bool] = False

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
        self.prefix, self.head_dim = prefix, head_dim_of(config)
        self.v_head_dim = self.value_head_dim(config)
        qkv_bias, o_bias = self.biases(config)
        self.qkv_proj = QKVParallelLinear(
            ctx,
            config.hidden_size,
            self.head_dim,
            config.num_attention_heads,
            self.kv_heads(config, layer_idx),
            bias=qkv_bias,
            v_head_dim=self.v_head_dim,
            prefix=join_prefix(prefix, "qkv_proj"),
            quant_config=quant_config,
        )
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.v_size = self.num_kv_heads * self.v_head_dim
        self.o_proj = RowParallelLinear(
            ctx,
            config.num_attention_heads * self.v_head_dim,
            config.hidden_size,
            bias=o_bias,
            prefix=join_prefix(prefix, "o_proj"),
            quant_config=quant_config,
        )
        self.rotary_emb = rotary
        self.attn = Attention(
            ctx,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.head_dim**-0.5,
            window=sliding_window_of(config, layer_idx),
            sinks=self.with_sinks,
            v_head_dim=self.v_head_dim,
            kv_heads=self.qkv_proj.kv_heads_held(),
        )
        self.sinks: torch.Tensor | None = None

    @staticmethod
    def biases(config: Any) -> tuple[bool, bool]:
        """(q/k/v bias, o_proj bias): both iff ``attention_bias`` (transformers' usual flag)."""
        bias = bool(getattr(config, "attention_bias", False))
        return bias, bias

    @staticmethod
    def kv_heads(config: Any, layer_idx: int) -> int:
        """The KV heads of layer ``layer_idx`` (all ranks together): ``num_key_value_heads``."""
        return config.num_key_value_heads

    @staticmethod
    def value_head_dim(config: Any) -> int:
        """Dv, the width of a value head: the head_dim (``head_dim_of``)."""
        return head_dim_of(config)

    def v_transform(self, v: torch.Tensor) -> torch.Tensor:
        """Applied to v [T, Hkv, Dv] before it is cached; none by default."""
        return v

    def qk_transform(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Applied to q [T, Hq, D] and k [T, Hkv, D] before rope; none by default."""
        return q, k

    def qk_after_rope(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Applied to q and k after rope (Hunyuan's per-head norms); none by default."""
        return q, k

    def forward(self, hidden: torch.Tensor, step: Step) -> torch.Tensor:
        tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.v_size], dim=-1)
        q = q.view(tokens, self.num_heads, self.head_dim)
        k = k.view(tokens, self.num_kv_heads, self.head_dim)
        v = self.v_transform(v.view(tokens, self.num_kv_heads, self.v_head_dim))
        q, k = self.qk_transform(q, k)
        q, k = self.qk_after_rope(*self.rotary_emb(step.positions, q, k))
        out = self.attn(q, k, v, step, sinks=self.sinks)
        return self.o_proj(out.reshape(tokens, self.num_heads * self.v_head_dim))
