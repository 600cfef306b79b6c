"""Triton kernels of the MoE data movement (private: the wrappers live in hetero.kernels.moe).

moe_permute is a stable counting sort of the P = M * k (token, slot) pairs by expert, done in
four launches and no host sync:

1. ``_count_kernel``, one program per block of BLOCK_P consecutive pairs: the block's count
   per expert (a one-hot [BLOCK_P, E] tile summed over pairs), stored as row b of
   counts[NB, E], and added into totals[E] with integer atomics (order-free, so exact).
2. ``_offsets_kernel``, one program per BLOCK_E experts: group_ends = inclusive prefix sum of
   totals (the sum of the earlier experts plus a cumsum over its own slice), then an
   exclusive scan down its columns of counts (chunks of BLOCK_B blocks) giving
   offsets[b, e] = the first sorted row of expert e's pairs from block b.
3. ``_place_kernel``, one program per block: each pair's rank among the earlier pairs of the
   block with its expert (a cumsum of the one-hot tile), so its sorted row is
   offsets[b, e] + rank: pairs keep flat order within an expert (stable). Writes
   perm[row] = pair and, when asked, the inverse inv[pair] = row.
4. ``_gather_rows_kernel``: x_sorted[r] = x[perm[r] // k] over (row tile, column tile).

moe_unpermute: ``_invert_kernel`` (inv[perm[r]] = r), then ``_combine_kernel`` with one
program per (token tile, column tile) summing its k slots in float32 in slot order:
deterministic, no atomics.

Indices are masked, never trusted: a pair whose expert id lies outside [0, E) gets no sorted row
(it is dropped: its inverse is -1 and it contributes zero to the combine); a perm value outside
[0, P) writes nothing; a sorted row no pair filled gathers zeros; an inverse outside the sorted
rows adds zero.
"""

from __future__ import annotations

from hetero.kernels._triton import triton_modules

triton, tl = triton_modules()

# Reductions and scans go through the builtins tl.reduce / tl.associative_scan with Triton's own
# combine functions, not tl.sum / tl.cumsum (jit functions of triton.language): those
# are interpreted only if TRITON_INTERPRET was set before triton's first import (a test session
# that imported triton earlier fails with "Cannot call @triton.jit'd outside of the scope of a
# kernel"), and each nested jit call costs the interpreter a re-patch of triton.language. The
# interpreter maps these combine functions to NumPy; a compiler emits what tl.sum would. For the
# same reason tl.zeros / tl.cdiv are written as tl.full / integer arithmetic.
_SUM = tl.standard._sum_combine


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, totals_ptr, P, E, E_POW2: tl.constexpr, BLOCK_P: tl.constexpr):
    b = tl.program_id(0)
    p = b * BLOCK_P + tl.arange(0, BLOCK_P)
    e = tl.load(ids_ptr + p, mask=p < P, other=-1).to(tl.int32)
    experts = tl.arange(0, E_POW2)
    hits = (e[:, None] == experts[None, :]).to(tl.int32)
    counts = tl.reduce(hits, 0, _SUM)
    e_ok = experts < E
    tl.store(counts_ptr + b.to(tl.int64) * E + experts, counts, mask=e_ok)
    tl.atomic_add(totals_ptr + experts, counts, mask=e_ok & (counts > 0))


@triton.jit
def _offsets_kernel(counts_ptr, totals_ptr, offsets_ptr, ends_ptr, NB, E,
                    E_POW2: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_B: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    first = pid * BLOCK_E
    experts = tl.arange(0, E_POW2)
    totals = tl.load(totals_ptr + experts, mask=experts < E, other=0)
    before = tl.reduce(tl.where(experts < first, totals, 0), 0, _SUM)  # rows of the experts before this slice
    mine = first + tl.arange(0, BLOCK_E)
    e_ok = mine < E
    my_totals = tl.load(totals_ptr + mine, mask=e_ok, other=0)
    ends = before + tl.associative_scan(my_totals, 0, _SUM)
    tl.store(ends_ptr + mine, ends, mask=e_ok)
    run = ends - my_totals  # the first row of each expert
    rb = tl.arange(0, BLOCK_B)
    for b0 in range(0, NB, BLOCK_B):
        blk = b0 + rb
        ok = (blk < NB)[:, None] & e_ok[None, :]
        where = blk[:, None].to(tl.int64) * E + mine[None, :]
        c = tl.load(counts_ptr + where, mask=ok, other=0)
        tl.store(offsets_ptr + where, run[None, :] + tl.associative_scan(c, 0, _SUM) - c, mask=ok)
        run += tl.reduce(c, 0, _SUM)


@triton.jit
def _place_kernel(ids_ptr, offsets_ptr, perm_ptr, inv_ptr, P, E,
                  WRITE_INV: tl.constexpr, E_POW2: tl.constexpr, BLOCK_P: tl.constexpr):  # fmt: skip
    b = tl.program_id(0)
    p = b * BLOCK_P + tl.arange(0, BLOCK_P)
    p_ok = p < P
    e = tl.load(ids_ptr + p, mask=p_ok, other=-1).to(tl.int32)
    experts = tl.arange(0, E_POW2)
    hits = (e[:, None] == experts[None, :]).to(tl.int32)
    offsets = tl.load(offsets_ptr + b.to(tl.int64) * E + experts, mask=experts < E, other=0)
    # sorted row = offsets[e] + (pairs of this block before p with expert e)
    row = tl.reduce(hits * (offsets[None, :] + tl.associative_scan(hits, 0, _SUM) - 1), 1, _SUM)
    # a pair with an expert id outside [0, E) gets no row; the row bound costs one compare and keeps
    # a wrong offset (a bug here, or in the count kernels) from writing past perm
    known = (e >= 0) & (e < E) & (row >= 0) & (row < P)
    tl.store(perm_ptr + row, p.to(tl.int64), mask=p_ok & known)
    if WRITE_INV:
        tl.store(inv_ptr + p, tl.where(known, row, -1), mask=p_ok)


@triton.jit
def _gather_rows_kernel(x_ptr, perm_ptr, out_ptr, P, H, TOPK, s_xm, s_xh, s_om, s_oh,
                        BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr):  # fmt: skip
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    r_ok = r < P
    pair = tl.load(perm_ptr + r, mask=r_ok, other=0)
    src = pair // TOPK
    ok = (r_ok & (pair >= 0) & (pair < P))[:, None] & (h < H)[None, :]  # a row no pair filled: zeros
    v = tl.load(x_ptr + src[:, None] * s_xm + h[None, :] * s_xh, mask=ok, other=0)
    ok = r_ok[:, None] & (h < H)[None, :]
    tl.store(out_ptr + r[:, None].to(tl.int64) * s_om + h[None, :] * s_oh, v, mask=ok)


@triton.jit
def _invert_kernel(perm_ptr, inv_ptr, P, s_p, BLOCK: tl.constexpr):
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = r < P
    pair = tl.load(perm_ptr + r * s_p, mask=ok, other=0)
    tl.store(inv_ptr + pair, r, mask=ok & (pair >= 0) & (pair < P))  # a perm value outside [0, P): no write


@triton.jit
def _combine_kernel(y_ptr, inv_ptr, w_ptr, out_ptr, M, H, TOPK,
                    s_ym, s_yh, s_wm, s_wk, s_om, s_oh,
                    ACC: tl.constexpr, SOFT_RTNE: tl.constexpr,
                    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr):  # fmt: skip
    """out[m] = sum over s of w[m, s] * y[inv[m * TOPK + s]], accumulated in ACC."""
    m = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    m_ok = m < M
    ok = m_ok[:, None] & (h < H)[None, :]
    acc = tl.full((BLOCK_T, BLOCK_H), 0, ACC)
    for s in range(0, TOPK):
        row = tl.load(inv_ptr + m.to(tl.int64) * TOPK + s, mask=m_ok, other=0)
        w = tl.load(w_ptr + m.to(tl.int64) * s_wm + s * s_wk, mask=m_ok, other=0.0).to(ACC)
        row_ok = (row >= 0) & (row < M * TOPK)  # a pair without a sorted row contributes zero
        y = tl.load(y_ptr + row[:, None].to(tl.int64) * s_ym + h[None, :] * s_yh, mask=ok & row_ok[:, None], other=0.0)
        acc += w[:, None] * y.to(ACC)
    if SOFT_RTNE and out_ptr.dtype.element_ty == tl.bfloat16:  # the interpreter truncates to bf16: round first
        bits = acc.to(tl.float32).to(tl.uint32, bitcast=True)
        acc = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
    tl.store(out_ptr + m[:, None].to(tl.int64) * s_om + h[None, :] * s_oh, acc.to(out_ptr.dtype.element_ty), mask=ok)
