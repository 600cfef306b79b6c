"""DeepSeek-V4's KV compressors and the CSA lightning indexer over their entries (``kv_compress``, ``indexer_topk``).

Per layer with compression (transformers' ``DeepseekV4HCACompressor`` / ``DeepseekV4CSACompressor``):

- ``kv_proj`` / ``gate_proj`` project the attention's input to C*D rows (C = 2 with ``overlap``: CSA's two
  series), ``position_bias`` [m, C*D] and the float32 RMSNorm ``kv_norm`` [D] pool every window of m
  tokens into one entry, roped at the window's first position with the "compress" table;
- the entries live in a paged entry of one slot per m tokens (``comp_cache``, in the blocks of the
  attention cache), and the raw rows of the last C*m tokens in two state entries, so a window may span
  chunked-prefill chunks and decode steps; a prefix-cache hit needs the state snapshot of its block;
- a CSA layer's ``indexer`` is a compressor of its own at ``index_head_dim`` plus the scorer: queries
  ``q_b_proj(q_resid)`` roped at their positions, weights ``weights_proj(x) * Hi**-0.5 * Di**-0.5``, and
  ``indexer_topk(compress_ratio=m)`` picks each row's ``index_topk`` entries.

Tensor parallel: every projection here is replicated (the single KV head and its compressors are
shared by all heads), so each rank writes the same entries and picks the same indices.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.cached import CachedLayer, PagedEntry, StateEntry
from hetero.engine.layers.linear import ReplicatedLinear
from hetero.engine.layers.norm import RMSNorm
from hetero.engine.layers.rotary import RotaryEmbedding
from hetero.engine.layers.weights import copy_checked, join_prefix
from hetero.engine.quant.config import QuantConfig
from hetero.engine.step import Step
from hetero.spec.types import AttentionMeta

__all__ = ["Compressor", "CompressedIndexer"]


class Compressor(CachedLayer):
    """``forward(hidden [T, H], step, comp_meta)``: writes the entries of the windows this step closes.

    ``comp_meta`` is the step's ``AttentionMeta`` over this ratio's compressed block table (the model
    derives it once per step). ``rotary`` is a twin of the "compress" table.
    """

    def __init__(
        self,
        ctx: ModelContext,
        hf_config: Any,
        *,
        ratio: int,
        overlap: bool,
        head_dim: int,
        rotary: RotaryEmbedding,
        prefix: str = "",
        quant_config: QuantConfig | None = None,
    ):
        super().__init__()
        self.prefix, self.ratio, self.overlap, self.head_dim = prefix, int(ratio), bool(overlap), int(head_dim)
        self.width = (2 if overlap else 1) * self.head_dim
        self.eps = float(hf_config.rms_norm_eps)
        for name in ("kv_proj", "gate_proj"):
            layer = ReplicatedLinear(
                ctx, hf_config.hidden_size, self.width, prefix=join_prefix(prefix, name), quant_config=quant_config
            )
            self.add_module(name, layer)
        bias = nn.Parameter(ctx.empty(self.ratio, self.width, dtype=torch.float32), requires_grad=False)
        what = join_prefix(prefix, "position_bias")
        bias.weight_loader = lambda p, t, shard=None: copy_checked(p, t, what)
        bias.shards = (None,)
        self.position_bias = bias
        fp32 = dataclasses.replace(ctx, dtype=torch.float32)
        self.kv_norm = RMSNorm(fp32, self.head_dim, self.eps, prefix=join_prefix(prefix, "kv_norm"))
        self.rotary = rotary
        ctx.bind_op(self, "_compress", "kv_compress")
        self.comp_cache: torch.Tensor | None = None
        self.kv_state: torch.Tensor | None = None
        self.gate_state: torch.Tensor | None = None

    def cache_spec(self) -> tuple[PagedEntry | StateEntry, ...]:
        rows = (2 if self.overlap else 1) * self.ratio
        return (
            PagedEntry("comp_cache", (self.head_dim,), tokens_per_slot=self.ratio),
            StateEntry("kv_state", (rows, self.width), init="flag"),
            StateEntry("gate_state", (rows, self.width), init="flag"),
        )

    def forward(self, hidden: torch.Tensor, step: Step, comp_meta: AttentionMeta) -> None:
        if self.comp_cache is None:
            raise RuntimeError(f"{self.prefix}: the compressed cache is not allocated (ModelRunner binds it)")
        self._compress(
            self.kv_proj(hidden),
            self.gate_proj(hidden),
            self.position_bias,
            self.kv_norm.weight,
            self.rotary.cos_sin_cache,
            self.comp_cache,
            self.kv_state,
            self.gate_state,
            comp_meta,
            step.state_slots,
            ratio=self.ratio,
            overlap=self.overlap,
            eps=self.eps,
        )


class CompressedIndexer(Compressor):
    """A CSA layer's lightning indexer: its own overlapping compressor at ``index_head_dim``, then
    ``forward(hidden, q_resid, step, comp_meta) -> int32 [T, index_topk]`` entry indices (-1 padded)."""

    def __init__(self, ctx: ModelContext, hf_config: Any, *, ratio: int, rotary: RotaryEmbedding, **kw: Any):
        c = hf_config
        super().__init__(ctx, c, ratio=ratio, overlap=True, head_dim=int(c.index_head_dim), rotary=rotary, **kw)
        self.num_heads, self.topk = int(c.index_n_heads), int(c.index_topk)
        self.weight_scale = self.num_heads**-0.5 * self.head_dim**-0.5
        at = dict(quant_config=kw.get("quant_config"))
        self.q_b_proj = ReplicatedLinear(
            ctx, c.q_lora_rank, self.num_heads * self.head_dim, prefix=join_prefix(self.prefix, "q_b_proj"), **at
        )
        self.scorer = nn.Module()
        self.scorer.weights_proj = ReplicatedLinear(
            ctx, c.hidden_size, self.num_heads, prefix=join_prefix(self.prefix, "scorer.weights_proj"), **at
        )
        ctx.bind_op(self, "_topk", "indexer_topk", compress_ratio=self.ratio)

    def forward(  # type: ignore[override]
        self, hidden: torch.Tensor, q_resid: torch.Tensor, step: Step, comp_meta: AttentionMeta
    ) -> torch.Tensor:
        super().forward(hidden, step, comp_meta)
        t, rot = hidden.shape[0], self.rotary.cos_sin_cache.shape[-1]
        q = self.q_b_proj(q_resid).view(t, self.num_heads, self.head_dim)
        q_rot, _ = self.rotary(step.positions, q[..., -rot:], q[:, :1, -rot:])
        q = torch.cat([q[..., :-rot], q_rot], dim=-1)
        weights = self.scorer.weights_proj(hidden).float() * self.weight_scale
        return self._topk(q, weights, self.comp_cache, comp_meta, topk=self.topk, compress_ratio=self.ratio)
