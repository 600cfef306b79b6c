"""The Triton kernel of sparse absorbed MLA (DSA): ``mla_attention(..., topk_indices=...)``.

One program owns one query row and a block of ``BLOCK_H`` heads (the M dimension of its dots,
padded to 16). It streams the row's index list in ``BLOCK_N`` tiles: each entry is a key
position, kept when ``0 <= j <= pos`` (causal) or ``0 <= j < seq_len``, mapped through the
block table (block ids masked against [0, NB)) to gather the latent rows ckv [Lkv] and kpe [R];
the logits ``scale * (q_nope . ckv + q_pe . kpe)`` feed an online softmax in float32 (base 2)
whose values are the gathered ckv tile itself. A tile with no entry kept (the -1 padding of a short
context) is skipped. Sinks (spec 1.7), one logit per head, join the denominator once, after the
last tile, and add no value; lse excludes them. A row that keeps no entry gets out 0 and lse -inf.

Rows reach the kernel as (sequence, position) pairs computed on the device by the launcher;
every index (the entries, the positions, seq_lens, block ids) is untrusted and clamped or masked,
so a malformed call computes garbage, never an access outside the tensors.
"""

from __future__ import annotations

from hetero.kernels._rounding import cast_out
from hetero.kernels._triton import triton_modules

triton, tl = triton_modules()

__all__ = ["sparse_mla_kernel"]

SUM = tl.standard._sum_combine
MAX = tl.standard._elementwise_max


@triton.jit
def _gather(ptr, blk, slot, ok, s_b, s_s, s_d, DIM: tl.constexpr, DIM_P: tl.constexpr, UPCAST: tl.constexpr):
    """Rows (blk, slot) of a paged cache, transposed: [DIM_P, BLOCK_N] (zero where not ok)."""
    d = tl.arange(0, DIM_P).to(tl.int64)
    x = tl.load(
        ptr + (blk * s_b + slot * s_s)[None, :] + d[:, None] * s_d, mask=ok[None, :] & (d < DIM)[:, None], other=0.0
    )
    if UPCAST:
        x = x.to(tl.float32)
    return x


@triton.jit
def sparse_mla_kernel(
    qn_ptr, qp_ptr, ckv_ptr, kpe_ptr, idx_ptr, table_ptr, row_seq_ptr, row_pos_ptr, kv_len_ptr, out_ptr, lse_ptr,
    sinks_ptr,
    sqn_t, sqn_h, sqn_d, sqp_t, sqp_h, sqp_d, sc_b, sc_s, sc_d, sp_b, sp_s, sp_d,
    si_t, si_k, s_tab, s_tab_c, so_t, so_h, so_d, sl_t, sl_h,
    num_heads, num_blocks, max_kv_len, topk, scale,
    BS: tl.constexpr, LKV: tl.constexpr, R: tl.constexpr, LKV_P: tl.constexpr, R_P: tl.constexpr,
    CAUSAL: tl.constexpr, RETURN_LSE: tl.constexpr, HAS_SINKS: tl.constexpr, UPCAST: tl.constexpr,
    RNE_BF16: tl.constexpr,
    DOT_PREC: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = h < num_heads
    b = tl.load(row_seq_ptr + t).to(tl.int64)
    pos = tl.load(row_pos_ptr + t).to(tl.int64)
    seq_len = tl.minimum(tl.maximum(tl.load(kv_len_ptr + b).to(tl.int64), 0), max_kv_len)
    last = seq_len - 1  # the largest visible position
    if CAUSAL:
        last = tl.minimum(last, pos)

    d = tl.arange(0, LKV_P).to(tl.int64)
    q = tl.load(
        qn_ptr + t * sqn_t + h[:, None] * sqn_h + d[None, :] * sqn_d, mask=hm[:, None] & (d < LKV)[None, :], other=0.0
    )
    e = tl.arange(0, R_P).to(tl.int64)
    qp = tl.load(
        qp_ptr + t * sqp_t + h[:, None] * sqp_h + e[None, :] * sqp_d, mask=hm[:, None] & (e < R)[None, :], other=0.0
    )
    if UPCAST:
        q = q.to(tl.float32)
        qp = qp.to(tl.float32)
    table_ptr += b * s_tab
    idx_ptr += t * si_t
    qk_scale = scale * 1.4426950408889634  # base 2
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_H], 0.0, tl.float32)
    acc = tl.full([BLOCK_H, LKV_P], 0.0, tl.float32)
    offs = tl.arange(0, BLOCK_N).to(tl.int64)
    for k0 in range(0, topk, BLOCK_N):
        k = k0 + offs
        j = tl.load(idx_ptr + k * si_k, mask=k < topk, other=-1).to(tl.int64)
        ok = (k < topk) & (j >= 0) & (j <= last)
        j = tl.where(ok, j, 0)
        blk = tl.load(table_ptr + (j // BS) * s_tab_c, mask=ok, other=0).to(tl.int64)
        ok = ok & (blk >= 0) & (blk < num_blocks)
        if tl.reduce(ok.to(tl.int32), 0, MAX) != 0:  # a tile of padding (-1s, invisible positions) costs no dot
            blk = tl.where(ok, blk, 0)
            slot = j % BS
            kt = _gather(ckv_ptr, blk, slot, ok, sc_b, sc_s, sc_d, LKV, LKV_P, UPCAST)
            pt = _gather(kpe_ptr, blk, slot, ok, sp_b, sp_s, sp_d, R, R_P, UPCAST)
            s = tl.dot(q, kt, input_precision=DOT_PREC) + tl.dot(qp, pt, input_precision=DOT_PREC)
            s = tl.where(ok[None, :], s * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.reduce(s, 1, MAX))
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing kept yet: no NaN
            alpha = tl.exp2(m_i - m_ref)
            p = tl.exp2(s - m_ref[:, None])
            l_i = l_i * alpha + tl.reduce(p, 1, SUM)
            acc = acc * alpha[:, None] + tl.dot(p.to(kt.dtype), tl.trans(kt), input_precision=DOT_PREC)
            m_i = m_new

    if HAS_SINKS:  # the sink's exp joins the denominator (rebased to the larger of the two maxima)
        sink = tl.load(sinks_ptr + h, mask=hm, other=0.0).to(tl.float32) * 1.4426950408889634
        m_f = tl.maximum(m_i, sink)
        m_f = tl.where(m_f == float("-inf"), 0.0, m_f)
        alpha = tl.exp2(m_i - m_f)
        denom = l_i * alpha + tl.exp2(sink - m_f)
        o = acc * (alpha / tl.where(denom > 0.0, denom, 1.0))[:, None]
    else:
        o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    o_ptr = out_ptr + t * so_t + h[:, None] * so_h + d[None, :] * so_d
    tl.store(o_ptr, cast_out(o, out_ptr.dtype.element_ty, RNE_BF16), mask=hm[:, None] & (d < LKV)[None, :])
    if RETURN_LSE:
        lse = tl.where(l_i > 0.0, (m_i + tl.log2(tl.where(l_i > 0.0, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
        tl.store(lse_ptr + t * sl_t + h * sl_h, lse, mask=hm)
