"""Paged attention: new keys and values go into the cache (``write_kv``), queries read it (``paged_attention``)."""

from __future__ import annotations

import torch

from hetero.engine.context import ModelContext
from hetero.engine.layers.cached import CachedLayer, PagedEntry, Shard
from hetero.engine.step import Step

__all__ = ["Attention"]


class Attention(CachedLayer):
    """One op for prefill, chunked prefill and decode over this layer's paged KV cache.

    q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, Dv] of this rank's heads (Dv: ``v_head_dim``, default D); returns
    [T, Hq, Dv]. With ``sinks`` the caller passes float32 [Hq] sink logits (gpt-oss, this rank's heads) to every
    call; the op is resolved with that option. ``kv_heads``: (this rank's first KV head, the model's KV heads)
    under tensor parallelism, where its cache sits in a cache of every head.
    """

    def __init__(
        self,
        ctx: ModelContext,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        *,
        window: tuple[int, int] = (-1, -1),
        sinks: bool = False,
        v_head_dim: int | None = None,
        kv_heads: tuple[int, int] | None = None,
    ):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        first, total = kv_heads or (0, num_kv_heads)
        self.kv_shard = Shard.of(0, total, range(first, first + num_kv_heads))
        self.v_head_dim = v_head_dim or head_dim
        self.scale, self.window = float(scale), window
        ctx.bind_op(self, "_write_kv", "write_kv")
        options = {"sinks": True} if sinks else {}
        if self.v_head_dim != head_dim:
            options["head_dim_v"] = self.v_head_dim
        ctx.bind_op(self, "_attention", "paged_attention", head_dim=head_dim, **options)
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None

    def cache_spec(self) -> tuple[PagedEntry, ...]:
        return (
            PagedEntry("k_cache", (self.num_kv_heads, self.head_dim), shard=self.kv_shard),
            PagedEntry("v_cache", (self.num_kv_heads, self.v_head_dim), shard=self.kv_shard),
        )

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, step: Step, sinks: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.k_cache is None:
            raise RuntimeError("Attention: the KV cache is not allocated (ModelRunner binds it before the first step)")
        self._write_kv(k, v, self.k_cache, self.v_cache, step.slot_mapping)
        if sinks is None:
            return self._attention(q, self.k_cache, self.v_cache, step.meta, scale=self.scale, window=self.window)
        return self._attention(
            q, self.k_cache, self.v_cache, step.meta, scale=self.scale, window=self.window, sinks=sinks
        )
