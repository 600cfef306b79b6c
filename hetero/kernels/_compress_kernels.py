"""Triton kernels of kv_compress (private: the launcher lives in ``hetero.kernels.compress``).

* ``compress_entry_kernel``: one program per emitted entry (sequence b, window w), from the call's
  entry list. It walks the window's C*m slots in tiles of BLOCK_J, each slot's half-row read from
  this call's rows (token q >= start) or from the sequence's state ring (row q % R), a slot before
  token 0 masked out, and keeps an online softmax per channel (running max, sum and weighted sum,
  in float32, float64 for float64 inputs) so the whole pooled entry [D] stays in registers. Then the
  RMS norm, the rope of the trailing rot dims and one store into the compressed cache, rounded once.
  Channels are held as pairs counted from the end, (D-2-2i, D-1-2i), which are exactly the rope's
  interleaved pairs (2i', 2i'+1) of the dims D-rot.. for i < rot/2 (i' = rot/2 - 1 - i), so the
  rotation needs no shuffle and any D works (an odd D leaves channel -1 of the last pair masked).
* ``compress_state_kernel``: a 2-D grid of (tile of rows, tile of C*D): each of the call's rows
  among its sequence's last R tokens is copied into the ring at q % R, bit for bit. It runs after the entry
  kernel on the same stream, so every ring row the entries read is read before it is overwritten.

Every index read from a tensor (sequence, window, slot, row, block id, position) is clamped or
masked to its tensor, so no malformed call reads or writes outside them.
"""

from __future__ import annotations

from hetero.kernels._layer_kernels import _SUM_COMBINE
from hetero.kernels._rounding import cast_out
from hetero.kernels._triton import triton_modules

triton, tl = triton_modules()

__all__ = ["compress_entry_kernel", "compress_state_kernel"]

_MAX = tl.standard._elementwise_max


@triton.jit
def _slot_rows(x_ptr, st_ptr, row, p, ring, col, from_call, from_ring, cm, x_t, x_c, st_s, st_r, st_c):
    """[BLOCK_J, HALF_P] half-rows: from this call's row ``row`` or ring row ``ring`` of slot p (0 elsewhere)."""
    a = tl.load(x_ptr + row[:, None] * x_t + col * x_c, mask=from_call[:, None] & cm, other=0.0)
    b = tl.load(st_ptr + p * st_s + ring[:, None] * st_r + col * st_c, mask=from_ring[:, None] & cm, other=0.0)
    return a + b


@triton.jit
def _online(logit, v, mx, den, acc):
    """One tile of slots folded into the per-channel online softmax (mx, den, acc) over axis 0."""
    new = tl.maximum(mx, tl.reduce(logit, 0, _MAX))
    safe = tl.where(new == float("-inf"), 0.0, new)
    alpha = tl.exp(mx - safe)
    e = tl.exp(logit - safe[None, :])
    den = den * alpha + tl.reduce(e, 0, _SUM_COMBINE)
    acc = acc * alpha + tl.reduce(e * v, 0, _SUM_COMBINE)
    return new, den, acc


@triton.jit
def compress_entry_kernel(
    kv_ptr, gate_ptr, kvs_ptr, gs_ptr, pb_ptr, nw_ptr, cs_ptr, cache_ptr, table_ptr,
    qsl_ptr, lens_ptr, slots_ptr, ent_seq_ptr, ent_w_ptr,
    T, B, S, NBC, BSC, P, COLS, M, R, J, D, HALF_ROT, eps,
    kv_t, kv_c, g_t, g_c, kvs_s, kvs_r, kvs_c, gs_s, gs_r, gs_c, pb_m, pb_c, nw_s, cs_p, cs_c,
    c_b, c_o, c_d, tb_b, tb_c,
    OVERLAP: tl.constexpr, ACC: tl.constexpr, RNE_BF16: tl.constexpr, HALF_P: tl.constexpr, BLOCK_J: tl.constexpr,
):  # fmt: skip
    e = tl.program_id(0)
    w = tl.load(ent_w_ptr + e).to(tl.int64)
    if w < 0:
        return
    b = tl.minimum(tl.maximum(tl.load(ent_seq_ptr + e).to(tl.int64), 0), B - 1)
    p = tl.minimum(tl.maximum(tl.load(slots_ptr + b).to(tl.int64), 0), S - 1)
    s = tl.load(qsl_ptr + b).to(tl.int64)
    start = tl.load(lens_ptr + b).to(tl.int64) - (tl.load(qsl_ptr + b + 1).to(tl.int64) - s)
    i = tl.arange(0, HALF_P)
    ch_b = D - 1 - 2 * i  # the pair (D-2-2i, D-1-2i), counted from the end
    ch_a = ch_b - 1
    ok_a, ok_b = ch_a >= 0, ch_b >= 0
    mx_a = tl.full([HALF_P], float("-inf"), ACC)
    mx_b, den_a, den_b = mx_a, tl.full([HALF_P], 0.0, ACC), tl.full([HALF_P], 0.0, ACC)
    acc_a, acc_b = den_a, den_b
    jj = tl.arange(0, BLOCK_J)
    c0 = 1 if OVERLAP else 0  # the half of the window's own tokens (Cb with overlap)
    for j0 in range(0, J, BLOCK_J):
        j = j0 + jj
        q = (w - c0) * M + j  # slot j holds token (w - C + 1) * m + j
        present = (j < J) & (q >= 0)
        from_call = present & (q >= start)
        from_ring = present & (q < start)
        row = tl.minimum(tl.maximum(s + q - start, 0), T - 1)
        ring = tl.where(q >= 0, q % R, 0)
        if OVERLAP:
            half = tl.where(j < M, 0, 1)  # the previous window's tokens read Ca, the window's own Cb
        else:
            half = tl.full([BLOCK_J], 0, tl.int32)
        col_a, col_b = (half * D)[:, None] + ch_a[None, :], (half * D)[:, None] + ch_b[None, :]
        bias_row = tl.where(q >= 0, q % M, 0)[:, None] * pb_m
        pm_a, pm_b = present[:, None] & ok_a[None, :], present[:, None] & ok_b[None, :]
        g_a = _slot_rows(gate_ptr, gs_ptr, row, p, ring, col_a, from_call, from_ring, ok_a[None, :],
                         g_t, g_c, gs_s, gs_r, gs_c).to(ACC)  # fmt: skip
        g_b = _slot_rows(gate_ptr, gs_ptr, row, p, ring, col_b, from_call, from_ring, ok_b[None, :],
                         g_t, g_c, gs_s, gs_r, gs_c).to(ACC)  # fmt: skip
        g_a += tl.load(pb_ptr + bias_row + col_a * pb_c, mask=pm_a, other=0.0).to(ACC)
        g_b += tl.load(pb_ptr + bias_row + col_b * pb_c, mask=pm_b, other=0.0).to(ACC)
        v_a = _slot_rows(kv_ptr, kvs_ptr, row, p, ring, col_a, from_call, from_ring, ok_a[None, :],
                         kv_t, kv_c, kvs_s, kvs_r, kvs_c).to(ACC)  # fmt: skip
        v_b = _slot_rows(kv_ptr, kvs_ptr, row, p, ring, col_b, from_call, from_ring, ok_b[None, :],
                         kv_t, kv_c, kvs_s, kvs_r, kvs_c).to(ACC)  # fmt: skip
        mx_a, den_a, acc_a = _online(tl.where(present[:, None], g_a, float("-inf")), v_a, mx_a, den_a, acc_a)
        mx_b, den_b, acc_b = _online(tl.where(present[:, None], g_b, float("-inf")), v_b, mx_b, den_b, acc_b)
    y_a = tl.where(ok_a, acc_a / den_a, 0.0)
    y_b = tl.where(ok_b, acc_b / den_b, 0.0)
    ss = tl.reduce(y_a * y_a, 0, _SUM_COMBINE) + tl.reduce(y_b * y_b, 0, _SUM_COMBINE)
    inv = 1.0 / tl.sqrt(ss / D + eps)
    y_a = y_a * inv * tl.load(nw_ptr + ch_a * nw_s, mask=ok_a, other=0.0).to(ACC)
    y_b = y_b * inv * tl.load(nw_ptr + ch_b * nw_s, mask=ok_b, other=0.0).to(ACC)
    pos = tl.minimum(w * M, P - 1)
    rot = i < HALF_ROT
    k = tl.where(rot, HALF_ROT - 1 - i, 0)
    cos = tl.load(cs_ptr + pos * cs_p + k * cs_c, mask=rot, other=1.0).to(ACC)
    sin = tl.load(cs_ptr + pos * cs_p + (HALF_ROT + k) * cs_c, mask=rot, other=0.0).to(ACC)
    r_a, r_b = y_a * cos - y_b * sin, y_b * cos + y_a * sin
    col = tl.minimum(w // BSC, COLS - 1)
    blk = tl.minimum(tl.maximum(tl.load(table_ptr + b * tb_b + col * tb_c).to(tl.int64), 0), NBC - 1)
    out = cache_ptr + blk * c_b + (w % BSC) * c_o
    dst = cache_ptr.dtype.element_ty
    tl.store(out + ch_a * c_d, cast_out(r_a, dst, RNE_BF16), mask=ok_a)
    tl.store(out + ch_b * c_d, cast_out(r_b, dst, RNE_BF16), mask=ok_b)


@triton.jit
def compress_state_kernel(
    kv_ptr, gate_ptr, kvs_ptr, gs_ptr, seq_ptr, pos_ptr, lens_ptr, slots_ptr,
    T, S, R, W,
    kv_t, kv_c, g_t, g_c, kvs_s, kvs_r, kvs_c, gs_s, gs_r, gs_c,
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    tm = t < T
    b = tl.load(seq_ptr + t, mask=tm, other=0)
    q = tl.load(pos_ptr + t, mask=tm, other=-1)
    p = tl.load(slots_ptr + b, mask=tm, other=-1).to(tl.int64)
    last = tl.load(lens_ptr + b, mask=tm, other=0).to(tl.int64) - R
    keep = tm & (p >= 0) & (p < S) & (q >= 0) & (q >= last)  # the sequence's last R tokens, a real slot
    at = (tl.where(keep, p, 0) * kvs_s + tl.where(keep, q % R, 0) * kvs_r)[:, None] + cols[None, :] * kvs_c
    at_g = (tl.where(keep, p, 0) * gs_s + tl.where(keep, q % R, 0) * gs_r)[:, None] + cols[None, :] * gs_c
    m2 = keep[:, None] & (cols < W)[None, :]
    tl.store(kvs_ptr + at, tl.load(kv_ptr + t[:, None] * kv_t + cols[None, :] * kv_c, mask=m2), mask=m2)
    tl.store(gs_ptr + at_g, tl.load(gate_ptr + t[:, None] * g_t + cols[None, :] * g_c, mask=m2), mask=m2)
