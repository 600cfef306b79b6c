"""Argument checks of ``compressed_attention`` (spec 1.8, DeepSeek-V4), split from ``hetero.spec.checks``.

``check_compressed_attention`` reads host metadata only (shapes, dtypes, devices, options): the
always-on checks. ``check_comp_block_table`` reads the compressed cache's block table on the host
against the token counts ``check_meta`` returned: the index-content check. ``compressed_attention`` here is
the op's validator (``hetero.spec.validate.VALIDATORS``, which imports it from here).
The entries of ``topk_indices`` need none: every entry a row cannot see is skipped by definition.
"""

from __future__ import annotations

import math
import numbers
from typing import Sequence

import torch

from hetero.errors import OpError
from hetero.spec._checks_core import INDEX_DTYPES, _first, check_same_device, check_tensor, meta_tensors
from hetero.spec._checks_meta import check_meta, check_meta_shapes
from hetero.spec.types import FLOAT_DTYPES, AttentionMeta

__all__ = ["check_compressed_attention", "check_comp_block_table", "compressed_attention"]

_STATS = (torch.float32, torch.float64)  # sinks: float32 by the spec, float64 in the oracle's run


def _int(x: object, least: int) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool) and x >= least


def _cache(op: str, arg: str, cache: object, query: torch.Tensor) -> tuple[int, int]:
    """A paged cache [N, BS, D] of the query's dtype and head dim, BS >= 1: returns (N, BS)."""
    c = check_tensor(op, arg, cache, ndim=3, dtypes=(query.dtype,))
    if not (c.shape[2] == query.shape[2]):
        raise OpError(op, arg, f"head dim {query.shape[2]} (that of 'query')", f"shape {list(c.shape)}")
    if not (c.shape[1] >= 1):
        raise OpError(op, arg, "a block size >= 1", f"shape {list(c.shape)}")
    return c.shape[0], c.shape[1]


def check_compressed_attention(
    op: str,
    query: object,
    kv_cache: object,
    comp_cache: object,
    meta: object,
    comp_block_table: object,
    scale: object,
    window: object,
    ratio: object,
    sinks: object,
    topk_indices: object,
    return_lse: object,
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
) -> tuple[int, int, int, int, int, int, int]:
    """Every argument of compressed_attention but the index contents: query [T, H, D] of ``dtypes``;
    kv_cache [NB, BS, D] and comp_cache [NBc, BSc, D] of its dtype; meta an AttentionMeta;
    comp_block_table int32/int64 [B, *]; scale finite; window and ratio ints >= 1; sinks float32
    [H] or None; topk_indices int32/int64 [T, K >= 1] or None; return_lse a bool; one device.
    Returns (T, H, D, NB, BS, NBc, BSc)."""
    q = check_tensor(op, "query", query, ndim=3, dtypes=dtypes)
    t, h, d = q.shape
    nb, bs = _cache(op, "kv_cache", kv_cache, q)
    nbc, bsc = _cache(op, "comp_cache", comp_cache, q)
    batch = check_meta_shapes(op, meta, t).seq_lens.shape[0]
    table = check_tensor(op, "comp_block_table", comp_block_table, ndim=2, dtypes=INDEX_DTYPES)
    if not (table.shape[0] == batch):
        raise OpError(op, "comp_block_table", f"{batch} rows (one per sequence)", f"shape {list(table.shape)}")
    if not (isinstance(scale, numbers.Real) and not isinstance(scale, bool) and math.isfinite(scale)):
        raise OpError(op, "scale", "a finite float", repr(scale))
    if not _int(window, 1):
        raise OpError(op, "window", "an int >= 1 (the raw rows a query row sees, its own included)", repr(window))
    if not _int(ratio, 1):
        raise OpError(op, "ratio", "an int >= 1 (tokens per compressed entry)", repr(ratio))
    if sinks is not None:
        check_tensor(op, "sinks", sinks, shape=(h,), dtypes=_STATS)
    if topk_indices is not None:
        idx = check_tensor(op, "topk_indices", topk_indices, ndim=2, dtypes=INDEX_DTYPES)
        if not (idx.shape[0] == t and idx.shape[1] >= 1):
            raise OpError(
                op, "topk_indices", f"shape [{t}, K] with K >= 1 (one row per query token)", f"shape {list(idx.shape)}"
            )
    if not isinstance(return_lse, bool):
        raise OpError(op, "return_lse", "a bool", repr(return_lse))
    check_same_device(
        op,
        query=q,
        kv_cache=kv_cache,
        comp_cache=comp_cache,
        comp_block_table=table,
        sinks=sinks,
        topk_indices=topk_indices,
        **meta_tensors(meta),
    )
    return t, h, d, nb, bs, nbc, bsc


def check_comp_block_table(
    op: str, comp_block_table: torch.Tensor, seq_lens: Sequence[int], ratio: int, num_blocks: int, block_size: int
) -> list[list[int]]:
    """The compressed cache's block table against the sequences' token counts (host read): sequence b
    holds ``seq_lens[b] // ratio`` entries, so it needs ``ceil(that / BSc)`` columns, each a block id
    in [0, NBc). Returns, per sequence, the block ids of its entries."""
    if not (comp_block_table.ndim == 2 and comp_block_table.shape[0] == len(seq_lens)):
        want = f"{len(seq_lens)} rows (one per sequence)"
        raise OpError(op, "comp_block_table", want, f"shape {list(comp_block_table.shape)}")
    entries = torch.tensor([int(s) // ratio for s in seq_lens], dtype=torch.int64)
    used = (entries + block_size - 1).div(block_size, rounding_mode="floor")
    cols = comp_block_table.shape[1]
    b = _first(used > cols)
    if b is not None:
        raise OpError(
            op,
            "comp_block_table",
            f"at least {int(used[b])} columns for the {int(entries[b])} compressed entries of sequence {b}"
            f" (seq_lens {int(seq_lens[b])} // ratio {ratio}) with block size {block_size}",
            str(cols),
        )
    table = comp_block_table.to("cpu", torch.int64)
    in_use = torch.arange(cols)[None, :] < used[:, None]
    bad = _first(in_use & ((table < 0) | (table >= num_blocks)))
    if bad is not None:
        row, col = divmod(bad, cols)
        raise OpError(
            op, "comp_block_table", f"block ids in [0, {num_blocks})", f"{int(table[row, col])} at [{row}, {col}]"
        )
    rows = table.tolist()
    return [rows[i][: int(u)] for i, u in enumerate(used.tolist())]


def compressed_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    comp_cache: torch.Tensor,
    meta: AttentionMeta,
    comp_block_table: torch.Tensor,
    *,
    ratio: int,
    **_: object,
) -> None:
    """The validator: meta against kv_cache as paged_attention's (unless a checked step plan serves it),
    then comp_block_table against each sequence's ``seq_lens[b] // ratio`` entries and NBc blocks."""
    op = "compressed_attention"
    t = check_tensor(op, "query", query, ndim=3).shape[0]
    nb, bs = check_tensor(op, "kv_cache", kv_cache, ndim=3).shape[:2]
    nbc, bsc = check_tensor(op, "comp_cache", comp_cache, ndim=3).shape[:2]
    plan = meta.planned(t, nb, bs) if isinstance(meta, AttentionMeta) else None
    if plan is None or not plan.checked:
        check_meta(op, meta, t, nb, bs)
    check_tensor(op, "comp_block_table", comp_block_table, ndim=2)
    if not _int(ratio, 1):
        raise OpError(op, "ratio", "an int >= 1 (tokens per compressed entry)", repr(ratio))
    check_comp_block_table(op, comp_block_table, meta.seq_lens.tolist(), ratio, nbc, bsc)
