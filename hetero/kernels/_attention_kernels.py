"""The Triton kernel behind paged, varlen and MLA attention: one flash-style forward pass.

One program owns one *tile* of one sequence for one KV head: ``BLOCK_M`` rows of the
sequence's flattened (query token, query head of the group) space, token-major, so the
``GROUP`` query heads that read one KV head share every K/V tile it loads (GQA, MQA, and
MLA with its single latent head, where the group is all H heads). The program streams the
sequence's keys in ``BLOCK_N`` tiles with an online softmax in float32 (base 2), skipping
tiles that lie wholly outside the tile's causal / sliding-window range.

Keys are addressed either through the block table of a paged cache (``PAGED``: key j lives
at block ``block_table[b, j // BS]``, slot ``j % BS``) or as rows ``cu_k[b] + j`` of a
dense packed tensor. An optional second query/key pair (``HAS_PE``) adds ``q2 . k2`` to the
logits (MLA: the rope part), and ``V_IS_K`` takes the values from the key tile already in
registers (MLA: values are the latent ``ckv``), under the interpreter too (measured with triton
3.9: no slower than loading them again). Head dims are padded to powers of two (``*_P``) and masked.

Index metadata is untrusted (validation off costs no host sync): each program clamps its
sequence's query rows into [0, T) and its keys into the dense key rows or the block table's
columns (``seq_lens`` > columns * BS reads no further), and masks every block id it loads
against [0, NB): a block id outside it reads as a zero key and value. So a malformed call
computes garbage, never an access outside the tensors.

Row max and sum are ``tl.reduce`` with Triton's own combine functions (what ``tl.max`` and
``tl.sum`` expand to for float32): the interpreter maps those to NumPy directly, and, unlike a
call to the ``@jit`` functions ``tl.max``/``tl.sum``, they also work when Triton was imported
before the interpreter was switched on (Triton's own jit functions are then compiled-mode
ones, which an interpreted kernel cannot call). Likewise no ``tl.zeros`` (also a jit function).

Triton is imported only through ``triton_modules()``; this module loads lazily.
"""

from __future__ import annotations

from hetero.kernels._triton import triton_modules

triton, tl = triton_modules()

__all__ = ["attention_fwd_kernel"]


@triton.jit
def _tanh(x):
    """tanh in float32 without a libdevice call (portable to every Triton target): the odd
    Taylor series below 0.25 (no cancellation near 0), (1 - e) / (1 + e), e = exp(-2|x|), above."""
    ax = tl.abs(x)
    e = tl.exp(-2.0 * ax)
    big = (1.0 - e) / (1.0 + e)
    x2 = ax * ax
    poly = 1.0 + x2 * (
        -0.3333333333333333 + x2 * (0.13333333333333333 + x2 * (-0.05396825396825397 + x2 * 0.021869488536155203))
    )
    t = tl.where(ax < 0.25, ax * poly, big)
    return tl.where(x < 0.0, -t, t)


@triton.jit
def attention_fwd_kernel(
    q_ptr, q2_ptr, k_ptr, k2_ptr, v_ptr, out_ptr, lse_ptr, sinks_ptr,
    table_ptr, kv_len_ptr, cu_q_ptr, cu_k_ptr, tile_seq_ptr, tile_start_ptr,
    # strides: query [T, H, D], second query [T, H, D2]
    sq_t, sq_h, sq_d, sq2_t, sq2_h, sq2_d,
    # keys/values: paged [NB, BS, Hkv, D] (block, slot, head, dim) or dense [Tk, Hkv, D] (row, -, head, dim)
    sk_b, sk_s, sk_h, sk_d, sk2_b, sk2_s, sk2_h, sk2_d, sv_b, sv_s, sv_h, sv_d,
    so_t, so_h, so_d, sl_t, sl_h, s_tab, s_tab_c,
    scale, softcap, w_left, w_right,
    num_q_rows, num_k_rows, max_kv_len,
    GROUP: tl.constexpr, BS: tl.constexpr,
    D: tl.constexpr, D2: tl.constexpr, DV: tl.constexpr,
    D_P: tl.constexpr, D2_P: tl.constexpr, DV_P: tl.constexpr,
    PAGED: tl.constexpr, HAS_PE: tl.constexpr, V_IS_K: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_WL: tl.constexpr, HAS_WR: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr, RETURN_LSE: tl.constexpr,
    UPCAST: tl.constexpr, DOT_PREC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # index math in int64: pointer offsets of big caches need it, and the interpreter's
    # int32 overflow checks (one per int32 add/mul) cost more than the arithmetic
    tile = tl.program_id(0)
    hk = tl.program_id(1).to(tl.int64)
    b = tl.load(tile_seq_ptr + tile)
    if b < 0:  # the grid is an upper bound on the tile count
        return
    start = tl.load(tile_start_ptr + tile).to(tl.int64)  # first flattened (token, head) row of the tile
    # metadata is untrusted: the query rows are clamped into [0, num_q_rows), the keys into the
    # dense rows [0, num_k_rows) or the table's columns (max_kv_len = columns * BS)
    q0 = tl.minimum(tl.maximum(tl.load(cu_q_ptr + b).to(tl.int64), 0), num_q_rows)
    n = tl.maximum(tl.minimum(tl.load(cu_q_ptr + b + 1).to(tl.int64), num_q_rows) - q0, 0)
    if PAGED:
        k0 = 0
        L = tl.minimum(tl.maximum(tl.load(kv_len_ptr + b).to(tl.int64), 0), max_kv_len)
    else:
        k0 = tl.minimum(tl.maximum(tl.load(cu_k_ptr + b).to(tl.int64), 0), num_k_rows)
        L = tl.maximum(tl.minimum(tl.load(cu_k_ptr + b + 1).to(tl.int64), num_k_rows) - k0, 0)

    # ---- the tile's rows: flattened (token, head of the group), token-major
    rows = n * GROUP
    if start >= rows:  # clamped metadata can leave a tile of the (unclamped) tile table empty
        return
    offs_m = start + tl.arange(0, BLOCK_M)
    row_ok = offs_m < rows
    tok = offs_m // GROUP
    head = hk * GROUP + offs_m % GROUP
    shift = L - n
    pos = shift + tok  # bottom-right aligned position of each row
    q_row = q0 + tok

    offs_d = tl.arange(0, D_P).to(tl.int64)
    q_off = q_row * sq_t + head * sq_h
    q = tl.load(
        q_ptr + (q_off[:, None] + offs_d[None, :] * sq_d), mask=row_ok[:, None] & (offs_d < D)[None, :], other=0.0
    )
    if UPCAST:
        q = q.to(tl.float32)
    # per-dim offsets and masks of the K^T / V tiles, hoisted out of the key loop
    k_ptr += hk * sk_h
    kd_off = offs_d[:, None] * sk_d
    kd_ok = (offs_d < D)[:, None]
    if HAS_PE:
        offs_d2 = tl.arange(0, D2_P).to(tl.int64)
        q2_off = q_row * sq2_t + head * sq2_h
        q2 = tl.load(
            q2_ptr + (q2_off[:, None] + offs_d2[None, :] * sq2_d),
            mask=row_ok[:, None] & (offs_d2 < D2)[None, :],
            other=0.0,
        )
        if UPCAST:
            q2 = q2.to(tl.float32)
        k2_ptr += hk * sk2_h
        k2d_off = offs_d2[:, None] * sk2_d
        k2d_ok = (offs_d2 < D2)[:, None]
    offs_dv = tl.arange(0, DV_P).to(tl.int64)
    v_ptr += hk * sv_h
    vd_off = offs_dv[None, :] * sv_d
    vd_ok = (offs_dv < DV)[None, :]
    if PAGED:
        table_ptr += b * s_tab

    # ---- the key range any row of the tile can see: [j_lo, j_hi)
    pos_lo = shift + start // GROUP
    pos_hi = shift + (tl.minimum(start + BLOCK_M, rows) - 1) // GROUP
    j_lo = 0
    j_hi = L
    if HAS_WL:
        j_lo = tl.maximum(pos_lo - w_left, 0)
    if CAUSAL:
        j_hi = tl.minimum(j_hi, pos_hi + 1)
    if HAS_WR:
        j_hi = tl.minimum(j_hi, pos_hi + w_right + 1)
    j_first = (j_lo // BLOCK_N) * BLOCK_N

    if HAS_SOFTCAP:
        qk_scale = scale
    else:
        qk_scale = scale * 1.4426950408889634  # straight to base 2
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, DV_P], 0.0, tl.float32)
    offs_bn = tl.arange(0, BLOCK_N).to(tl.int64)
    for j0 in range(j_first, j_hi, BLOCK_N):
        offs_n = j0 + offs_bn
        kv_ok = offs_n < j_hi
        if PAGED:
            blk = tl.load(table_ptr + (offs_n // BS) * s_tab_c, mask=kv_ok, other=0).to(tl.int64)  # [BLOCK_N] block ids
            kv_ok = kv_ok & (blk >= 0) & (blk < num_k_rows)  # a block id outside [0, NB): a zero key and value
            slot = offs_n % BS
            k_base = blk * sk_b + slot * sk_s
            if HAS_PE:
                k2_base = blk * sk2_b + slot * sk2_s
            if not V_IS_K:
                v_base = blk * sv_b + slot * sv_s
        else:
            krow = k0 + offs_n
            k_base = krow * sk_b
            if HAS_PE:
                k2_base = krow * sk2_b
            if not V_IS_K:
                v_base = krow * sv_b
        # K^T tiles [D, BLOCK_N], addressed transposed (a plain row-major operand for the dot)
        kt = tl.load(k_ptr + (k_base[None, :] + kd_off), mask=kv_ok[None, :] & kd_ok, other=0.0)
        if UPCAST:
            kt = kt.to(tl.float32)
        s = tl.dot(q, kt, input_precision=DOT_PREC)
        if HAS_PE:
            k2t = tl.load(k2_ptr + (k2_base[None, :] + k2d_off), mask=kv_ok[None, :] & k2d_ok, other=0.0)
            if UPCAST:
                k2t = k2t.to(tl.float32)
            s += tl.dot(q2, k2t, input_precision=DOT_PREC)
        s = s * qk_scale
        if HAS_SOFTCAP:
            s = (softcap * _tanh(s / softcap)) * 1.4426950408889634

        # visibility (rows past the tile's end are never stored: no row mask needed)
        if CAUSAL:  # j <= pos < L, and window[1] >= 0 adds nothing
            visible = offs_n[None, :] <= pos[:, None]
        else:
            visible = kv_ok[None, :]
            if HAS_WR:
                visible = visible & (offs_n[None, :] <= pos[:, None] + w_right)
        if HAS_WL:
            visible = visible & (offs_n[None, :] >= pos[:, None] - w_left)
        s = tl.where(visible, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.reduce(s, 1, tl.standard._elementwise_max))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet: no NaN
        alpha = tl.exp2(m_i - m_ref)
        p = tl.exp2(s - m_ref[:, None])
        l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine)
        if V_IS_K:  # values are the keys (MLA's latent): no second load
            v = tl.trans(kt)
        else:
            v = tl.load(v_ptr + (v_base[:, None] + vd_off), mask=kv_ok[:, None] & vd_ok, other=0.0)
            if UPCAST:
                v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
        m_i = m_new

    # ---- normalize (sinks join the denominator only), store out and lse
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head, mask=row_ok, other=0.0).to(tl.float32) * 1.4426950408889634
        m_f = tl.maximum(m_i, sink)
        m_f = tl.where(m_f == float("-inf"), 0.0, m_f)
        alpha = tl.exp2(m_i - m_f)
        denom = l_i * alpha + tl.exp2(sink - m_f)
        denom = tl.where(denom > 0.0, denom, 1.0)
        o = acc * (alpha / denom)[:, None]
    else:
        o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    o_off = q_row * so_t + head * so_h
    tl.store(
        out_ptr + (o_off[:, None] + offs_dv[None, :] * so_d),
        o.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & vd_ok,
    )
    if RETURN_LSE:
        lse = tl.where(l_i > 0.0, (m_i + tl.log2(tl.where(l_i > 0.0, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
        tl.store(lse_ptr + (q_row * sl_t + head * sl_h), lse, mask=row_ok)
