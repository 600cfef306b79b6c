"""DeepSeek-V4's attention: one shared K=V head over a sliding window plus compressed entries, with sinks.

Mirrors transformers 5.24's ``DeepseekV4Attention``:

- ``q = q_b_proj(q_a_norm(q_a_proj(x)))`` per head, through an unweighted RMS norm; ``kv = kv_norm(kv_proj(x))``,
  one head of ``head_dim`` D that is both the key and the value; both roped on their LAST ``rot`` dims in
  interleaved pairs, with the "main" table in sliding layers and the yarn "compress" table elsewhere;
- the window cache (``kv_cache`` [D] per token, written by ``write_index_k``'s exact copy) is read over the
  last ``sliding_window`` tokens; a sliding layer runs ``paged_attention`` over it as one KV head, a
  compressed layer ``compressed_attention`` with its compressor's entries (HCA: all visible; CSA: the
  indexer's top-k), both with the per-head ``sinks``;
- the output's rope dims are rotated back by the same table (``S R(p) S = R(-p)`` with S negating the second dim
  of each pair: two sign flips, no second table), then the grouped low-rank projection:
  ``o_a_proj`` maps each of ``o_groups`` head groups to ``o_lora_rank`` dims (``grouped_gemm``), ``o_b_proj``
  mixes them to the hidden size.

Tensor parallel: the query heads, the sinks and the head groups of ``o_a_proj`` are split over ranks
(``o_b_proj`` is row-parallel); the KV head, its cache and the compressors are replicated.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from hetero.engine.context import ModelContext
from hetero.engine.layers.cached import CachedLayer, PagedEntry
from hetero.engine.layers.compressor import CompressedIndexer, Compressor
from hetero.engine.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from hetero.engine.layers.norm import RMSNorm
from hetero.engine.layers.rotary import RotaryEmbedding
from hetero.engine.layers.weights import head_param, join_prefix
from hetero.engine.parallel import divide
from hetero.engine.quant.config import QuantConfig
from hetero.engine.step import Step
from hetero.spec.types import AttentionMeta

__all__ = ["GroupedLinear", "CompressedAttention", "LAYER_TYPES"]

#: DeepSeek-V4's ``layer_types``: (compressor overlap, indexer) per compressed kind; sliding layers have none
LAYER_TYPES = {
    "sliding_attention": None,
    "compressed_sparse_attention": (True, True),
    "heavily_compressed_attention": (False, False),
}


class GroupedLinear(ColumnParallelLinear):
    """``x [T, G, K] -> [T, G*N]``: group g through its own [N, K] block of one [G*N, K] weight (``grouped_gemm``);
    the groups are split over ranks."""

    def __init__(self, ctx: ModelContext, in_per_group: int, out_per_group: int, groups: int, **kw: Any):
        super().__init__(ctx, in_per_group, groups * out_per_group, **kw)
        self.groups, self.out_per_group = divide(groups, ctx.parallel.size, "o_groups"), out_per_group
        ctx.bind_op(self, "_grouped", "grouped_gemm")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t, g, k = x.shape
        w = self.quant_method.dense_weight(self).view(g, self.out_per_group, k)
        ends = torch.arange(1, g + 1, dtype=torch.int32, device=x.device) * t
        y = self._grouped(x.transpose(0, 1).reshape(g * t, k), w, ends)
        return y.view(g, t, self.out_per_group).transpose(0, 1).reshape(t, g * self.out_per_group)


class CompressedAttention(CachedLayer):
    """``forward(hidden [T, H], step, comp_metas) -> [T, H]`` (see the module docstring); ``comp_metas`` maps a
    compression ratio to the step's ``AttentionMeta`` over its compressed block table. ``rotary`` is this
    layer's table (main or compress); ``compress_rotary`` the compress table."""

    def __init__(
        self,
        ctx: ModelContext,
        hf_config: Any,
        layer_idx: int,
        rotary: RotaryEmbedding,
        compress_rotary: RotaryEmbedding,
        *,
        prefix: str = "",
        quant_config: QuantConfig | None = None,
    ):
        super().__init__()
        c, self.prefix = hf_config, prefix
        self.layer_type = c.layer_types[layer_idx]
        if self.layer_type not in LAYER_TYPES:
            raise ValueError(
                f"{prefix}: layer_types[{layer_idx}] = {self.layer_type!r}, expected one of {list(LAYER_TYPES)}"
            )
        self.head_dim, self.window = int(c.head_dim), int(c.sliding_window)
        self.num_heads = divide(c.num_attention_heads, ctx.parallel.size, "attention heads")
        self.scale = self.head_dim**-0.5
        self.eps = float(c.rms_norm_eps)
        at = dict(quant_config=quant_config)

        def name(n: str) -> str:
            return join_prefix(prefix, n)

        fp32 = dataclasses.replace(ctx, dtype=torch.float32)
        self.q_a_proj = ReplicatedLinear(ctx, c.hidden_size, c.q_lora_rank, prefix=name("q_a_proj"), **at)
        self.q_a_norm = RMSNorm(fp32, c.q_lora_rank, self.eps, prefix=name("q_a_norm"))
        self.q_b_proj = ColumnParallelLinear(
            ctx, c.q_lora_rank, c.num_attention_heads * self.head_dim, prefix=name("q_b_proj"), **at
        )
        self.register_buffer("unit", torch.ones(self.head_dim, device=ctx.device), persistent=False)
        self.kv_proj = ReplicatedLinear(ctx, c.hidden_size, self.head_dim, prefix=name("kv_proj"), **at)
        self.kv_norm = RMSNorm(fp32, self.head_dim, self.eps, prefix=name("kv_norm"))
        groups = int(c.o_groups)
        self.o_a_proj = GroupedLinear(
            ctx,
            c.num_attention_heads * self.head_dim // groups,
            int(c.o_lora_rank),
            groups,
            prefix=name("o_a_proj"),
            **at,
        )
        self.o_b_proj = RowParallelLinear(
            ctx, groups * int(c.o_lora_rank), c.hidden_size, prefix=name("o_b_proj"), **at
        )
        self.sinks = head_param(self.num_heads, ctx.parallel.rank, ctx.parallel.size, ctx.device, name("sinks"))
        self.rotary = rotary
        rot = rotary.cos_sin_cache.shape[-1]
        flip = torch.tensor([1.0, -1.0], device=ctx.device).repeat(rot // 2).to(ctx.dtype)
        self.register_buffer("flip", flip, persistent=False)
        kind = LAYER_TYPES[self.layer_type]
        self.ratio, self.compressor = 0, None
        if kind is not None:
            overlap, indexed = kind
            self.ratio = int(c.compress_rates[self.layer_type])
            comp = dict(ratio=self.ratio, rotary=compress_rotary, quant_config=quant_config)
            self.compressor = Compressor(
                ctx, c, overlap=overlap, head_dim=self.head_dim, prefix=name("compressor"), **comp
            )
            if indexed:
                self.compressor.indexer = CompressedIndexer(ctx, c, prefix=name("compressor.indexer"), **comp)
        ctx.bind_op(self, "_norm", "rms_norm")
        ctx.bind_op(self, "_write", "write_index_k")
        if self.compressor is None:
            ctx.bind_op(self, "_attention", "paged_attention", head_dim=self.head_dim, sinks=True)
        else:
            options = {"topk_indices": True} if self.layer_type == "compressed_sparse_attention" else {}
            ctx.bind_op(self, "_attention", "compressed_attention", sinks=True, **options)
        self.kv_cache: torch.Tensor | None = None

    def cache_spec(self) -> tuple[PagedEntry, ...]:
        return (PagedEntry("kv_cache", (self.head_dim,)),)

    def _rope(
        self, table: RotaryEmbedding, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``q [T, h, D]`` and ``k [T, 1, D]`` (or q's first head, when None) with their last rope dims rotated."""
        rot = table.cos_sin_cache.shape[-1]
        q_rot = q[..., -rot:].contiguous()
        q_rot, k_rot = table(positions, q_rot, q_rot[:, :1] if k is None else k[..., -rot:].contiguous())
        q = torch.cat([q[..., :-rot], q_rot], dim=-1)
        return q, (None if k is None else torch.cat([k[..., :-rot], k_rot], dim=-1))

    def forward(self, hidden: torch.Tensor, step: Step, comp_metas: dict[int, AttentionMeta]) -> torch.Tensor:
        if self.kv_cache is None:
            raise RuntimeError(
                f"{self.prefix}: the KV cache is not allocated (ModelRunner binds it before the first step)"
            )
        t, d = hidden.shape[0], self.head_dim
        q_resid = self.q_a_norm(self.q_a_proj(hidden))
        q = self._norm(self.q_b_proj(q_resid).view(t, self.num_heads, d), self.unit, self.eps)
        kv = self.kv_norm(self.kv_proj(hidden)).view(t, 1, d)
        q, kv = self._rope(self.rotary, step.positions, q, kv)
        self._write(kv.view(t, d), self.kv_cache, step.slot_mapping)
        if self.compressor is None:
            cache = self.kv_cache.unsqueeze(2)
            window = (self.window - 1, -1)
            out = self._attention(q, cache, cache, step.meta, scale=self.scale, window=window, sinks=self.sinks)
        else:
            meta = comp_metas[self.ratio]
            self.compressor(hidden, step, meta)
            options = {}
            indexer = getattr(self.compressor, "indexer", None)
            if indexer is not None:
                options["topk_indices"] = indexer(hidden, q_resid, step, meta)
            out = self._attention(
                q,
                self.kv_cache,
                self.compressor.comp_cache,
                step.meta,
                meta.block_table,
                scale=self.scale,
                window=self.window,
                ratio=self.ratio,
                sinks=self.sinks,
                **options,
            )
        rot = self.flip.shape[0]  # rotate back: flip, rotate by the position, flip
        back, _ = self._rope(self.rotary, step.positions, out[..., -rot:] * self.flip)
        out = torch.cat([out[..., :-rot], back * self.flip], dim=-1)
        groups = self.o_a_proj.groups
        return self.o_b_proj(self.o_a_proj(out.reshape(t, groups, -1)))
