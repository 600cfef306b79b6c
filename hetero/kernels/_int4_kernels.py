"""Triton kernels of the packed int4 (W4A16) GEMMs (private: the launchers live in ``hetero.kernels.int4``).

The weight stays packed in memory, two 4-bit codes a byte along K (``hetero.spec.gemm``'s encoding),
and is dequantized tile by tile inside the K loop (``_int4_product``):

* the [BLOCK_K / 2, BLOCK_N] byte tile is loaded as stored (contiguous along K), its low and high
  nibbles joined and interleaved into the [BLOCK_K, BLOCK_N] code tile (row 2j the low nibble of
  byte j); a k past K meets a zero column of ``a`` and a masked scale, so the high nibble of the
  last byte of an odd K never counts;
* ``w = float32(q - zp) * scale`` in float32, exactly the spec's one rounding; the zero point is 8
  without a zero-point tensor. With ALIGNED (the group size a multiple of BLOCK_K: a tile lies in
  one group) the tile's scales and zero points are one [BLOCK_N] row; otherwise each element finds
  its own group ``k // group_size`` (any group size, the last group partial);
* float32 ``a`` (TERMS 0): one IEEE float32 dot. 16-bit ``a``: the float32 w is split into TERMS
  terms of a's dtype (``hi`` = w rounded, ``mid`` = the rest rounded, ``lo`` = what is left), and
  the product is the sum of their products on the 16-bit matrix cores, float32-accumulated (each
  product of two 16-bit values is exact in float32). Two terms carry 16 (bf16) or 22 (fp16) of w's
  24 significant bits, far below a 16-bit output's rounding; a float32 output from bf16 ``a`` takes
  three (all 24), where a single 16-bit w would add an error of the output's own size. Under the
  interpreter (UPCAST, bf16 ``a``) the terms are cut by masking bits and summed into one float32 dot:
  its bf16 casts are slow, its bf16 dot wrong, and each dot a non-BLAS loop.

``int4_gemm_kernel`` tiles like ``_gemm_kernel`` (GROUP_M bands); ``int4_grouped_kernel`` is
``_grouped_gemm_kernel`` (work tiles located from group_ends in registers, each end clamped into
[0, M], rows past the last group stored as zeros; GATHER / SWIGLU / HAS_BIAS / ACT for fused_moe)
with this product. Every index read from a tensor (group ends, perm) is masked or clamped.
"""

from __future__ import annotations

from hetero.kernels._triton import triton_modules

triton, tl = triton_modules()

__all__ = ["int4_gemm_kernel", "int4_grouped_kernel"]

_SUM = tl.standard._sum_combine
_MAX = tl.standard._elementwise_max


@triton.jit
def _rtne(acc, SOFT: tl.constexpr):
    """float32 -> the bf16 grid, to nearest even (under the interpreter, which truncates on its own)."""
    if SOFT:
        bits = acc.to(tl.uint32, bitcast=True)
        acc = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
    return acc


@triton.jit
def _int4_product(a_ptrs, s_ak, b_rows, s_bk, s_rows, s_sk, z_rows, s_zk, m_ok, n_ok, K, GS,
                  HAS_ZP: tl.constexpr, ALIGNED: tl.constexpr, TERMS: tl.constexpr, UPCAST: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """float32 sum over K of a[m, k] * w[n, k]: ``a_ptrs`` [BLOCK_M, BLOCK_K] at k = 0, ``b_rows`` /
    ``s_rows`` / ``z_rows`` [BLOCK_N] pointers to byte / group 0 of each weight row."""
    rk = tl.arange(0, BLOCK_K)
    rj = tl.arange(0, BLOCK_K // 2)
    KB = (K + 1) // 2
    acc = tl.full((BLOCK_M, BLOCK_N), 0, tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        k_ok = kk < K
        kn_ok = k_ok[:, None] & n_ok[None, :]
        a = tl.load(a_ptrs + k0 * s_ak, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        jj = k0 // 2 + rj
        byte = tl.load(b_rows[None, :] + jj[:, None] * s_bk, mask=(jj < KB)[:, None] & n_ok[None, :], other=0)
        byte = byte.to(tl.int32)
        # rows 2j and 2j + 1 of the code tile: byte j's low and high nibbles
        q = tl.reshape(tl.permute(tl.join(byte & 0xF, byte >> 4), (0, 2, 1)), (BLOCK_K, BLOCK_N))
        if ALIGNED:  # one group for the whole tile
            grp = k0 // GS
            scale = tl.load(s_rows + grp * s_sk, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            if HAS_ZP:
                q -= tl.load(z_rows + grp * s_zk, mask=n_ok, other=8).to(tl.int32)[None, :]
            else:
                q -= 8
        else:
            grp = kk // GS
            scale = tl.load(s_rows[None, :] + grp[:, None] * s_sk, mask=kn_ok, other=0.0).to(tl.float32)
            if HAS_ZP:
                q -= tl.load(z_rows[None, :] + grp[:, None] * s_zk, mask=kn_ok, other=8).to(tl.int32)
            else:
                q -= 8
        w = q.to(tl.float32) * scale
        if TERMS == 0:
            acc = tl.dot(a.to(tl.float32), w, acc, input_precision="ieee")
        elif UPCAST:  # bf16 under the interpreter, whose bf16 dot is wrong and bf16 casts slow (and its dots
            # slow too): the terms' sum in one float32 dot, each term truncated to bf16 by masking
            if TERMS == 2:  # hi + mid: w's top 16 significant bits (three terms carry all of w)
                hi = (w.to(tl.uint32, bitcast=True) & 0xFFFF0000).to(tl.float32, bitcast=True)
                mid = ((w - hi).to(tl.uint32, bitcast=True) & 0xFFFF0000).to(tl.float32, bitcast=True)
                w = hi + mid
            acc = tl.dot(a.to(tl.float32), w, acc, input_precision="ieee")
        else:  # w = hi + mid (+ lo), each term exact in a's dtype, each product exact in float32
            hi = w.to(a.dtype)
            rest = w - hi.to(tl.float32)
            mid = rest.to(a.dtype)
            acc = tl.dot(a, hi, acc)
            acc = tl.dot(a, mid, acc)
            if TERMS == 3:
                acc = tl.dot(a, (rest - mid.to(tl.float32)).to(a.dtype), acc)
    return acc


@triton.jit
def int4_gemm_kernel(
    a_ptr, b_ptr, s_ptr, z_ptr, bias_ptr, c_ptr,
    M, N, K, GS,
    s_am, s_ak, s_bn, s_bk, s_sn, s_sk, s_zn, s_zk, s_cm, s_cn,
    HAS_ZP: tl.constexpr, HAS_BIAS: tl.constexpr, ALIGNED: tl.constexpr, TERMS: tl.constexpr,
    UPCAST: tl.constexpr, SOFT_RTNE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """c[M, N] = a[M, K] @ dequant(b)[N, K].T (+ bias[N] in float32), rounded once to c's dtype."""
    pid = tl.program_id(0)
    width = GROUP_M * ((N + BLOCK_N - 1) // BLOCK_N)
    first_m = (pid // width) * GROUP_M
    band_rows = tl.minimum(((M + BLOCK_M - 1) // BLOCK_M) - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % band_rows
    pid_n = (pid % width) // band_rows
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    rn64 = rn.to(tl.int64)
    acc = _int4_product(
        a_ptr + rm[:, None].to(tl.int64) * s_am + rk[None, :] * s_ak, s_ak,
        b_ptr + rn64 * s_bn, s_bk, s_ptr + rn64 * s_sn, s_sk, z_ptr + rn64 * s_zn, s_zk,
        m_ok, n_ok, K, GS, HAS_ZP, ALIGNED, TERMS, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if c_ptr.dtype.element_ty == tl.bfloat16:
        acc = _rtne(acc, SOFT_RTNE)
    c_ptrs = c_ptr + rm[:, None].to(tl.int64) * s_cm + rn[None, :] * s_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def int4_grouped_kernel(
    a_ptr, b_ptr, s_ptr, z_ptr, c_ptr, ends_ptr, perm_ptr, bias_ptr,
    M, N, K, G, GS, TOPK, A_ROWS, ALPHA, LIMIT,
    s_am, s_ak, s_bg, s_bn, s_bk, s_sg, s_sn, s_sk, s_zg, s_zn, s_zk, s_cm, s_cn, s_e, s_bias_g, s_bias_n,
    HAS_ZP: tl.constexpr, ALIGNED: tl.constexpr, TERMS: tl.constexpr, UPCAST: tl.constexpr,
    GATHER: tl.constexpr, SWIGLU: tl.constexpr, ACT: tl.constexpr, HAS_BIAS: tl.constexpr, SOFT_RTNE: tl.constexpr,
    G_POW2: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Rows [ends[g-1], ends[g]) of c = a_rows @ dequant(b[g]).T; rows past ends[G-1] = 0.

    GATHER: a_rows[r] = a[perm[r] // TOPK]. HAS_BIAS: bias[g, n] (and bias[g, n + N] for the up half)
    added in float32. SWIGLU: c[r, n] = act(gate, up) from weight rows n and n + N, each rounded to
    c's dtype first; ACT indexes hetero.spec.moe.ACTIVATIONS (0 silu, 1 swigluoai, 2 swiglu_clamp).
    """
    t = tl.program_id(0)
    pid_n = tl.program_id(1)
    gi = tl.arange(0, G_POW2)
    g_ok = gi < G
    ends = tl.minimum(tl.maximum(tl.load(ends_ptr + gi * s_e, mask=g_ok, other=0), 0), M).to(tl.int32)
    starts = tl.minimum(tl.maximum(tl.load(ends_ptr + (gi - 1) * s_e, mask=g_ok & (gi > 0), other=0), 0), M).to(
        tl.int32
    )
    tiles = (tl.maximum(ends - starts, 0) + BLOCK_M - 1) // BLOCK_M
    tiles_incl = tl.associative_scan(tiles, 0, _SUM)
    total = tl.reduce(tiles, 0, _SUM)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    if t < total:
        g = tl.reduce((tiles_incl <= t).to(tl.int32), 0, _SUM)
        here = gi == g
        first_tile = tl.reduce(tl.where(here, tiles_incl - tiles, 0), 0, _SUM)
        row0 = tl.reduce(tl.where(here, starts, 0), 0, _SUM) + (t - first_tile) * BLOCK_M
        row_end = tl.reduce(tl.where(here, ends, 0), 0, _SUM)
        rm = row0 + tl.arange(0, BLOCK_M)
        m_ok = rm < row_end
        if GATHER:
            src = tl.load(perm_ptr + rm, mask=m_ok, other=0) // TOPK
            m_ok = m_ok & (src >= 0) & (src < A_ROWS)  # a perm entry outside the pairs: a zero row
            src = tl.where(m_ok, src, 0)
        else:
            src = rm
        rk = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + src[:, None].to(tl.int64) * s_am + rk[None, :] * s_ak
        g64 = g.to(tl.int64)
        rn64 = rn.to(tl.int64)
        b_g = b_ptr + g64 * s_bg
        s_g = s_ptr + g64 * s_sg
        z_g = z_ptr + g64 * s_zg
        acc = _int4_product(
            a_ptrs, s_ak, b_g + rn64 * s_bn, s_bk, s_g + rn64 * s_sn, s_sk, z_g + rn64 * s_zn, s_zk,
            m_ok, n_ok, K, GS, HAS_ZP, ALIGNED, TERMS, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K,
        )  # fmt: skip
        if HAS_BIAS:
            b_at = bias_ptr + g64 * s_bias_g + rn64 * s_bias_n
            acc += tl.load(b_at, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        if SWIGLU:
            up_rows = rn64 + N
            up = _int4_product(
                a_ptrs, s_ak, b_g + up_rows * s_bn, s_bk, s_g + up_rows * s_sn, s_sk, z_g + up_rows * s_zn, s_zk,
                m_ok, n_ok, K, GS, HAS_ZP, ALIGNED, TERMS, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K,
            )  # fmt: skip
            if HAS_BIAS:
                up += tl.load(b_at + N * s_bias_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            if c_ptr.dtype.element_ty == tl.bfloat16:
                acc = _rtne(acc, SOFT_RTNE)
                up = _rtne(up, SOFT_RTNE)
            gate = acc.to(c_ptr.dtype.element_ty).to(tl.float32)
            up = up.to(c_ptr.dtype.element_ty).to(tl.float32)
            if ACT != 0:
                gate = tl.minimum(gate, LIMIT)
                up = tl.minimum(tl.maximum(up, -LIMIT), LIMIT)
            if ACT == 1:
                acc = (up + 1.0) * gate / (1.0 + tl.exp(-ALPHA * gate))
            else:
                acc = gate / (1.0 + tl.exp(-gate)) * up
        if c_ptr.dtype.element_ty == tl.bfloat16:
            acc = _rtne(acc, SOFT_RTNE)
        c_ptrs = c_ptr + rm[:, None].to(tl.int64) * s_cm + rn[None, :] * s_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm < row_end)[:, None] & n_ok[None, :])
    else:
        row0 = tl.reduce(ends, 0, _MAX) + (t - total) * BLOCK_M
        if row0 < M:  # rows past the last group: zeros
            rm = row0 + tl.arange(0, BLOCK_M)
            zero = tl.full((BLOCK_M, BLOCK_N), 0, c_ptr.dtype.element_ty)
            c_ptrs = c_ptr + rm[:, None].to(tl.int64) * s_cm + rn[None, :] * s_cn
            tl.store(c_ptrs, zero, mask=(rm < M)[:, None] & n_ok[None, :])
