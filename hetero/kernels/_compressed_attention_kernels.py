"""The Triton kernel of compressed_attention (spec 1.8, DeepSeek-V4): one online softmax over a
sliding window of raw K=V rows and the compressed entries, with per-head sinks.

One program owns one query row and a block of ``BLOCK_H`` heads (the M dimension of its dots,
padded to 16): MQA, so every head of the block reads the same K=V rows, each tile loaded once per
program. It walks the row's raw window (positions ``max(0, pos - W + 1) .. pos``) in ``BLOCK_N``
tiles through the KV block table, then its compressed entries through the compressed block table:
every entry ``w < (pos + 1) // m`` in tiles (HCA), or its ``topk_indices`` row in tiles, keeping the
entries ``0 <= w < (pos + 1) // m`` (CSA; a tile of padding costs no dot). Both sources feed one
float32 online softmax (base 2) whose values are the gathered tile itself. The sink, one logit per
head, joins the denominator once at the end and adds no value; lse excludes it. A row that keeps
nothing gets out 0 and lse -inf.

Rows reach the kernel as (sequence, position) pairs computed on the device by the launcher; every
index (positions, block ids, the listed entries, table columns) is untrusted and masked, so a
malformed call computes garbage, never an access outside the tensors.
"""

from __future__ import annotations

from hetero.kernels._rounding import cast_out
from hetero.kernels._triton import triton_modules

triton, tl = triton_modules()

__all__ = ["compressed_attention_kernel"]

SUM = tl.standard._sum_combine
MAX = tl.standard._elementwise_max
LOG2E = tl.constexpr(1.4426950408889634)  # a plain float global does not compile


@triton.jit
def _tile(ptr, table_ptr, s_tab_c, idx, ok, cols, num_blocks, s_b, s_s, s_d, BS: tl.constexpr, D: tl.constexpr,
          D_P: tl.constexpr, UPCAST: tl.constexpr):  # fmt: skip
    """Entries idx [BLOCK_N] of one sequence's paged cache: ([BLOCK_N, D_P] rows, zero where not
    kept; the kept mask, now also requiring a table column and a block id in range)."""
    ok = ok & (idx // BS < cols)
    idx = tl.where(ok, idx, 0)
    blk = tl.load(table_ptr + (idx // BS) * s_tab_c, mask=ok, other=0).to(tl.int64)
    ok = ok & (blk >= 0) & (blk < num_blocks)
    blk = tl.where(ok, blk, 0)
    d = tl.arange(0, D_P).to(tl.int64)
    rows = tl.load(
        ptr + (blk * s_b + (idx % BS) * s_s)[:, None] + d[None, :] * s_d,
        mask=ok[:, None] & (d < D)[None, :],
        other=0.0,
    )
    if UPCAST:
        rows = rows.to(tl.float32)
    return rows, ok


@triton.jit
def _fold(q, kv, ok, m_i, l_i, acc, qk_scale, DOT_PREC: tl.constexpr):
    """One tile of keys (which are the values) into the online softmax: (m_i, l_i, acc) updated."""
    s = tl.dot(q, tl.trans(kv), input_precision=DOT_PREC)
    s = tl.where(ok[None, :], s * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.reduce(s, 1, MAX))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing kept yet: no NaN
    alpha = tl.exp2(m_i - m_ref)
    p = tl.exp2(s - m_ref[:, None])
    l_i = l_i * alpha + tl.reduce(p, 1, SUM)
    acc = acc * alpha[:, None] + tl.dot(p.to(kv.dtype), kv, input_precision=DOT_PREC)
    return m_new, l_i, acc


@triton.jit
def compressed_attention_kernel(
    q_ptr, kv_ptr, comp_ptr, table_ptr, ctable_ptr, idx_ptr, row_seq_ptr, row_pos_ptr, out_ptr, lse_ptr, sinks_ptr,
    sq_t, sq_h, sq_d, skv_b, skv_s, skv_d, sc_b, sc_s, sc_d, s_tab, s_tab_c, s_ctab, s_ctab_c, si_t, si_k,
    so_t, so_h, so_d, sl_t, sl_h,
    num_heads, num_blocks, table_cols, num_comp_blocks, comp_cols, window, ratio, topk, scale,
    BS: tl.constexpr, BSC: tl.constexpr, D: tl.constexpr, D_P: tl.constexpr,
    HAS_TOPK: tl.constexpr, RETURN_LSE: tl.constexpr, HAS_SINKS: tl.constexpr, UPCAST: tl.constexpr,
    RNE_BF16: tl.constexpr, DOT_PREC: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = h < num_heads
    b = tl.load(row_seq_ptr + t).to(tl.int64)
    pos = tl.load(row_pos_ptr + t).to(tl.int64)

    d = tl.arange(0, D_P).to(tl.int64)
    q = tl.load(
        q_ptr + t * sq_t + h[:, None] * sq_h + d[None, :] * sq_d, mask=hm[:, None] & (d < D)[None, :], other=0.0
    )
    if UPCAST:
        q = q.to(tl.float32)
    qk_scale = scale * LOG2E
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_H], 0.0, tl.float32)
    acc = tl.full([BLOCK_H, D_P], 0.0, tl.float32)
    offs = tl.arange(0, BLOCK_N).to(tl.int64)

    # the sliding window: raw rows pos - W + 1 .. pos (position 0 at the earliest)
    table_ptr += b * s_tab
    first = tl.maximum(pos - window + 1, 0)
    for j0 in range(first, pos + 1, BLOCK_N):
        j = j0 + offs
        kv, ok = _tile(kv_ptr, table_ptr, s_tab_c, j, j <= pos, table_cols, num_blocks, skv_b, skv_s, skv_d,
                       BS, D, D_P, UPCAST)  # fmt: skip
        m_i, l_i, acc = _fold(q, kv, ok, m_i, l_i, acc, qk_scale, DOT_PREC)

    # the compressed entries whose window has closed: w < (pos + 1) // m
    ctable_ptr += b * s_ctab
    closed = tl.minimum(tl.maximum(pos + 1, 0) // ratio, comp_cols * BSC)  # no entry past the table's columns
    if HAS_TOPK:
        idx_ptr += t * si_t
        for k0 in range(0, topk, BLOCK_N):
            k = k0 + offs
            w = tl.load(idx_ptr + k * si_k, mask=k < topk, other=-1).to(tl.int64)
            keep = (k < topk) & (w >= 0) & (w < closed)
            if tl.reduce(keep.to(tl.int32), 0, MAX) != 0:  # a tile of -1 padding costs no dot
                kv, ok = _tile(comp_ptr, ctable_ptr, s_ctab_c, w, keep, comp_cols, num_comp_blocks, sc_b, sc_s, sc_d,
                               BSC, D, D_P, UPCAST)  # fmt: skip
                m_i, l_i, acc = _fold(q, kv, ok, m_i, l_i, acc, qk_scale, DOT_PREC)
    else:
        for w0 in range(0, closed, BLOCK_N):
            w = w0 + offs
            kv, ok = _tile(comp_ptr, ctable_ptr, s_ctab_c, w, w < closed, comp_cols, num_comp_blocks, sc_b, sc_s, sc_d,
                           BSC, D, D_P, UPCAST)  # fmt: skip
            m_i, l_i, acc = _fold(q, kv, ok, m_i, l_i, acc, qk_scale, DOT_PREC)

    if HAS_SINKS:  # the sink's exp joins the denominator (rebased to the larger of the two maxima)
        sink = tl.load(sinks_ptr + h, mask=hm, other=0.0).to(tl.float32) * LOG2E
        m_f = tl.maximum(m_i, sink)
        m_f = tl.where(m_f == float("-inf"), 0.0, m_f)
        alpha = tl.exp2(m_i - m_f)
        denom = l_i * alpha + tl.exp2(sink - m_f)
        o = acc * (alpha / tl.where(denom > 0.0, denom, 1.0))[:, None]
    else:
        o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    o_ptr = out_ptr + t * so_t + h[:, None] * so_h + d[None, :] * so_d
    tl.store(o_ptr, cast_out(o, out_ptr.dtype.element_ty, RNE_BF16), mask=hm[:, None] & (d < D)[None, :])
    if RETURN_LSE:
        lse = tl.where(l_i > 0.0, (m_i + tl.log2(tl.where(l_i > 0.0, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
        tl.store(lse_ptr + t * sl_t + h * sl_h, lse, mask=hm)
