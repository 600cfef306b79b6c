"""The checks of kv_compress (spec 1.8, DeepSeek-V4's KV compressor), for ``hetero.spec.checks``
(import them from there): each failure is an OpError naming the op, the argument, what was expected
and what came.

``check_kv_compress`` reads host metadata only (types, shapes, dtypes, devices): the always-on
check. ``check_kv_compress_indices`` reads the index values (a device-to-host copy on an
accelerator): what ``hetero.spec.validate`` runs when validation is on, and what the reference
runs on every call. ``kv_compress`` here is that validator, taking the op's own arguments.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import torch

from hetero.errors import OpError
from hetero.spec._checks_core import (
    INDEX_DTYPES,
    _first,
    check_cu_seqlens,
    check_same_device,
    check_tensor,
    meta_tensors,
)
from hetero.spec._checks_meta import check_meta_shapes
from hetero.spec.types import FLOAT_DTYPES, AttentionMeta

__all__ = ["COMPRESS_PARAM_DTYPES", "CompressDims", "check_kv_compress", "check_kv_compress_indices", "kv_compress"]

#: position_bias and norm_weight are float32 by the spec (the checkpoint keeps them so); float64 is the oracle's run.
COMPRESS_PARAM_DTYPES = (torch.float32, torch.float64)


class CompressDims(NamedTuple):
    """The sizes of one kv_compress call."""

    tokens: int  # T
    halves: int  # C: 2 with overlap (the Ca | Cb halves), else 1
    dim: int  # D, the compressed entry's width
    rot: int  # the rotated trailing dims
    ring: int  # R = C * m, the state rows per slot
    slots: int  # S
    blocks: int  # NBc
    block_size: int  # BSc
    positions: int  # P, the rows of cos_sin_cache


def _ratio(op: str, ratio: object) -> int:
    if not (type(ratio) is int and ratio >= 1):
        raise OpError(op, "ratio", "an int >= 1 (tokens pooled per compressed entry)", repr(ratio))
    return ratio


def check_kv_compress(
    op: str,
    kv: object,
    gate: object,
    position_bias: object,
    norm_weight: object,
    cos_sin_cache: object,
    comp_cache: object,
    kv_state: object,
    gate_state: object,
    meta: object,
    state_slots: object,
    ratio: object,
    overlap: object,
    eps: object,
) -> CompressDims:
    """The arguments of kv_compress (no index value read); returns the call's sizes."""
    m = _ratio(op, ratio)
    if not isinstance(overlap, bool):
        raise OpError(op, "overlap", "a bool (True: CSA's overlapping windows)", repr(overlap))
    ok_eps = isinstance(eps, numbers.Real) and not isinstance(eps, bool) and math.isfinite(eps) and eps > 0
    if not ok_eps:
        raise OpError(op, "eps", "a positive finite number", repr(eps))
    c = 2 if overlap else 1
    check_tensor(op, "kv", kv, ndim=2, dtypes=FLOAT_DTYPES)
    assert isinstance(kv, torch.Tensor)
    t, width = kv.shape
    if not (width >= c and width % c == 0):
        raise OpError(op, "kv", f"shape [T, C*D] with C = {c} and D >= 1", f"shape {list(kv.shape)}")
    d, ring = width // c, c * m
    check_tensor(op, "gate", gate, shape=(t, width), dtypes=(kv.dtype,))
    check_tensor(op, "position_bias", position_bias, shape=(m, width), dtypes=COMPRESS_PARAM_DTYPES)
    check_tensor(op, "norm_weight", norm_weight, shape=(d,), dtypes=COMPRESS_PARAM_DTYPES)
    cs_dtypes = tuple(dict.fromkeys((torch.float32, torch.float64, kv.dtype)))
    check_tensor(op, "cos_sin_cache", cos_sin_cache, ndim=2, dtypes=cs_dtypes)
    assert isinstance(cos_sin_cache, torch.Tensor)
    rot = cos_sin_cache.shape[1]
    if not (rot % 2 == 0 and 2 <= rot <= d):
        raise OpError(
            op, "cos_sin_cache", f"[P, rot] with rot even, 2 <= rot <= D = {d}", f"shape {list(cos_sin_cache.shape)}"
        )
    check_tensor(op, "comp_cache", comp_cache, shape=(None, None, d), dtypes=(kv.dtype,))
    assert isinstance(comp_cache, torch.Tensor)
    if not comp_cache.shape[1] >= 1:
        raise OpError(op, "comp_cache", "[NBc, BSc, D] with BSc >= 1", f"shape {list(comp_cache.shape)}")
    check_tensor(op, "kv_state", kv_state, shape=(None, ring, width), dtypes=(kv.dtype,))
    assert isinstance(kv_state, torch.Tensor)
    s = kv_state.shape[0]
    check_tensor(op, "gate_state", gate_state, shape=(s, ring, width), dtypes=(kv.dtype,))
    meta = check_meta_shapes(op, meta, t)
    check_tensor(op, "state_slots", state_slots, shape=(meta.num_seqs,), dtypes=INDEX_DTYPES)
    check_same_device(
        op,
        kv=kv,
        gate=gate,
        position_bias=position_bias,
        norm_weight=norm_weight,
        cos_sin_cache=cos_sin_cache,
        comp_cache=comp_cache,
        kv_state=kv_state,
        gate_state=gate_state,
        state_slots=state_slots,  # type: ignore[arg-type]
        **meta_tensors(meta),
    )
    nbc, bsc = comp_cache.shape[:2]
    return CompressDims(t, c, d, rot, ring, s, nbc, bsc, cos_sin_cache.shape[0])


def check_kv_compress_indices(
    op: str, meta: AttentionMeta, state_slots: torch.Tensor, ratio: int, dims: CompressDims
) -> tuple[list[int], list[int], list[int]]:
    """The index contents, on one host copy of each tensor: query_start_loc from 0 to T non-decreasing,
    seq_lens at least the query lengths, state slots in [-1, S); for each sequence with a slot that
    closes a window, block-table columns and block ids in [0, NBc) for the entries it writes and a
    cos_sin_cache row for each entry's position. Returns host lists (query_start_loc, seq_lens, slots)."""
    batch = meta.seq_lens.shape[0]
    qsl = check_cu_seqlens(op, "meta.query_start_loc", meta.query_start_loc, dims.tokens, batch)
    seq = meta.seq_lens.to("cpu", torch.int64)
    qlen = torch.tensor(qsl[1:], dtype=torch.int64) - torch.tensor(qsl[:-1], dtype=torch.int64)
    b = _first(seq < qlen)
    if b is not None:
        raise OpError(op, "meta.seq_lens", f"seq_lens[{b}] >= its query length {int(qlen[b])}", str(int(seq[b])))
    slots = state_slots.to("cpu", torch.int64)
    b = _first((slots < -1) | (slots >= dims.slots))
    if b is not None:
        raise OpError(
            op, "state_slots", f"slots in [-1, {dims.slots}) (-1 skips the sequence)", f"{int(slots[b])} at [{b}]"
        )
    first, end = (seq - qlen).div(ratio, rounding_mode="floor"), seq.div(ratio, rounding_mode="floor")
    active = (slots >= 0) & (end > first)  # the sequences that write an entry
    bs, cols = dims.block_size, meta.block_table.shape[1]
    used = (end + bs - 1).div(bs, rounding_mode="floor")
    b = _first(active & (used > cols))
    if b is not None:
        raise OpError(
            op,
            "meta.block_table",
            f"at least {int(used[b])} columns for the {int(end[b])} entries of seq_lens[{b}]={int(seq[b])}",
            str(cols),
        )
    table = meta.block_table.to("cpu", torch.int64)
    col = torch.arange(cols)[None, :]
    written = active[:, None] & (col >= first.div(bs, rounding_mode="floor")[:, None]) & (col < used[:, None])
    bad = _first(written & ((table < 0) | (table >= dims.blocks)))
    if bad is not None:
        row, c = divmod(bad, cols)
        raise OpError(
            op, "meta.block_table", f"block ids in [0, {dims.blocks})", f"{int(table[row, c])} at [{row}, {c}]"
        )
    b = _first(active & ((end - 1) * ratio >= dims.positions))
    if b is not None:
        last = int(end[b] - 1)
        raise OpError(
            op,
            "cos_sin_cache",
            f"at least {last * ratio + 1} rows (entry {last} of sequence {b} at position {last * ratio})",
            f"{dims.positions} rows",
        )
    return qsl, seq.tolist(), slots.tolist()


def kv_compress(
    kv: torch.Tensor,
    gate: object,
    position_bias: object,
    norm_weight: object,
    cos_sin_cache: torch.Tensor,
    comp_cache: torch.Tensor,
    kv_state: torch.Tensor,
    gate_state: object,
    meta: AttentionMeta,
    state_slots: torch.Tensor,
    *,
    ratio: int,
    **_: object,
) -> None:
    """The validator of kv_compress (``hetero.spec.validate.VALIDATORS``): the index contents that
    ``check_kv_compress_indices`` checks, after the type and rank of everything it reads."""
    op = "kv_compress"
    m = _ratio(op, ratio)
    for arg, x, ndim in (("kv", kv, 2), ("cos_sin_cache", cos_sin_cache, 2), ("comp_cache", comp_cache, 3)):
        check_tensor(op, arg, x, ndim=ndim)
    check_tensor(op, "kv_state", kv_state, ndim=3)
    meta = check_meta_shapes(op, meta, kv.shape[0])
    check_tensor(op, "state_slots", state_slots, shape=(meta.num_seqs,), dtypes=INDEX_DTYPES)
    nbc, bsc = comp_cache.shape[:2]
    dims = CompressDims(kv.shape[0], 1, 1, 2, m, kv_state.shape[0], nbc, max(bsc, 1), cos_sin_cache.shape[0])
    check_kv_compress_indices(op, meta, state_slots, m, dims)
