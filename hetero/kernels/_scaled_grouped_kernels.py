"""The Triton kernel of scaled_grouped_gemm and of fused_moe's quantized GEMMs (private: the
launchers live in ``hetero.kernels.quant`` and ``hetero.kernels.moe``).

``scaled_grouped_kernel`` is ``_grouped_gemm_kernel`` (one launch over every group, work tiles
located from group_ends in registers, each clamped into [0, M]; rows past the last group stored
as zeros; GATHER / SWIGLU / HAS_BIAS / ACT as there) with ``_scaled_gemm_kernel``'s arithmetic:

* each BLOCK_K step (BLOCK_K divides 128 when a scale is 128-blocked) is a fresh product:
  int8 in int32 (at most 128 * 127 * 127 < 2**24 per step: exact in int32 and in float32),
  fp8 in float32; with block scales it is multiplied by its block's scales before entering
  the float32 accumulator, else int8 accumulates in int32 over the whole of K;
* a zero point (int8, per-token a scale) is folded in exactly per step as
  ``sum_k (a - zp) b = sum_k a b - zp * sum_k b`` in int32;
* per-tensor / per-row / per-group scales are applied once in the epilogue;
* weight-only (A_FORM NONE): a float a tile times the b tile converted to float32 and, with
  block scales, multiplied by its scales (per channel / per group scales in the epilogue);
* b scales are addressed by absolute output column, so the up half of w13 (columns
  ``N + n``) finds its own channel or block scale whether or not N is a multiple of 128.

Under the interpreter (UPCAST) fp8 operands are converted to float32 before the dot (exact).
"""

from __future__ import annotations

from hetero.kernels._triton import triton_modules

triton, tl = triton_modules()

__all__ = ["scaled_grouped_kernel", "TENSOR", "ROW", "BLOCK", "NONE"]

_SUM = tl.standard._sum_combine
_MAX = tl.standard._elementwise_max
#: scale forms: a per tensor / b per group (0), per token / per channel (1), 128-blocks (2); NONE: a is
#: not quantized (fused_moe's weight-only mode: float a, b dequantized tile by tile)
TENSOR, ROW, BLOCK, NONE = 0, 1, 2, 3


@triton.jit
def _soft_bf16(acc, SOFT: tl.constexpr):
    if SOFT:
        bits = acc.to(tl.uint32, bitcast=True)
        acc = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
    return acc


@triton.jit
def _product(a_ptrs, b_ptrs, b_cols, zp, m_ok, n_ok, K, s_ak, s_bk, as_rows, s_ask, bs_g, s_bsn, s_bsk,
             A_FORM: tl.constexpr, B_FORM: tl.constexpr, IS_INT: tl.constexpr, HAS_ZP: tl.constexpr,
             UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """float32 sum over K of (a - zp) b with block scales applied per step (unscaled otherwise)."""
    BLOCKWISE: tl.constexpr = (A_FORM == 2) or (B_FORM == 2)
    rk = tl.arange(0, BLOCK_K)
    if B_FORM == 2:
        bs_rows = bs_g + (b_cols // 128).to(tl.int64) * s_bsn
    acc = tl.full((BLOCK_M, BLOCK_N), 0, tl.float32)
    acc_i = tl.full((BLOCK_M, BLOCK_N), 0, tl.int32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = rk < K - k0
        a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if A_FORM == 3:  # weight-only: float a times the dequantized b tile, in float32
            bf = b.to(tl.float32)
            if B_FORM == 2:
                bf *= tl.load(bs_rows + (k0 // 128) * s_bsk, mask=n_ok, other=0.0)[None, :]
            acc = tl.dot(a.to(tl.float32), bf, acc, input_precision="ieee")
        elif IS_INT:
            part_i = tl.dot(a, b, out_dtype=tl.int32)
            if HAS_ZP:
                part_i -= zp[:, None] * tl.reduce(b.to(tl.int32), 0, _SUM)[None, :]
            if BLOCKWISE:
                part = part_i.to(tl.float32)
            else:
                acc_i += part_i
        else:
            if UPCAST:
                part = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
            else:
                part = tl.dot(a, b)
        if A_FORM == 3:
            pass
        elif BLOCKWISE:
            kb = k0 // 128
            if A_FORM == 2:
                part *= tl.load(as_rows + kb * s_ask, mask=m_ok, other=0.0)[:, None]
            if B_FORM == 2:
                part *= tl.load(bs_rows + kb * s_bsk, mask=n_ok, other=0.0)[None, :]
            acc += part
        elif not IS_INT:
            acc += part
        a_ptrs += BLOCK_K * s_ak
        b_ptrs += BLOCK_K * s_bk
    if IS_INT and not BLOCKWISE:
        acc = acc_i.to(tl.float32)
    if A_FORM == 1:
        acc *= tl.load(as_rows, mask=m_ok, other=0.0)[:, None]
    if B_FORM == 1:
        acc *= tl.load(bs_g + b_cols.to(tl.int64) * s_bsn, mask=n_ok, other=0.0)[None, :]
    return acc


@triton.jit
def scaled_grouped_kernel(
    a_ptr, b_ptr, as_ptr, bs_ptr, zp_ptr, c_ptr, ends_ptr, perm_ptr, bias_ptr,
    M, N, K, G, TOPK, A_ROWS, ALPHA, LIMIT,
    s_am, s_ak, s_bg, s_bn, s_bk, s_asm, s_ask, s_bsg, s_bsn, s_bsk, s_zm, s_cm, s_cn, s_e, s_bias_g, s_bias_n,
    A_FORM: tl.constexpr, B_FORM: tl.constexpr, IS_INT: tl.constexpr, HAS_ZP: tl.constexpr, UPCAST: tl.constexpr,
    GATHER: tl.constexpr, SWIGLU: tl.constexpr, ACT: tl.constexpr, HAS_BIAS: tl.constexpr, SOFT_RTNE: tl.constexpr,
    G_POW2: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Rows [ends[g-1], ends[g]) of c = dequant(a_rows) @ dequant(b[g]).T (+ bias, SWIGLU epilogue)."""
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
        src = src.to(tl.int64)
        rk = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + src[:, None] * s_am + rk[None, :] * s_ak
        b_g = b_ptr + g.to(tl.int64) * s_bg
        bs_g = bs_ptr + g.to(tl.int64) * s_bsg
        as_rows = as_ptr + src * s_asm
        zp = tl.full((BLOCK_M,), 0, tl.int32)
        if HAS_ZP:
            zp = tl.load(zp_ptr + src * s_zm, mask=m_ok, other=0)
        acc = _product(
            a_ptrs,
            b_g + rn[None, :].to(tl.int64) * s_bn + rk[:, None] * s_bk,
            rn,
            zp,
            m_ok,
            n_ok,
            K,
            s_ak,
            s_bk,
            as_rows,
            s_ask,
            bs_g,
            s_bsn,
            s_bsk,
            A_FORM,
            B_FORM,
            IS_INT,
            HAS_ZP,
            UPCAST,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
        )
        scale = 1.0
        if A_FORM == 0:
            scale = tl.load(as_ptr)
        if B_FORM == 0:
            scale = scale * tl.load(bs_g)
        acc = acc * scale
        if HAS_BIAS:
            b_at = bias_ptr + g.to(tl.int64) * s_bias_g + rn.to(tl.int64) * s_bias_n
            acc += tl.load(b_at, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        if SWIGLU:
            up = (
                _product(
                    a_ptrs,
                    b_g + (rn + N)[None, :].to(tl.int64) * s_bn + rk[:, None] * s_bk,
                    rn + N,
                    zp,
                    m_ok,
                    n_ok,
                    K,
                    s_ak,
                    s_bk,
                    as_rows,
                    s_ask,
                    bs_g,
                    s_bsn,
                    s_bsk,
                    A_FORM,
                    B_FORM,
                    IS_INT,
                    HAS_ZP,
                    UPCAST,
                    BLOCK_M,
                    BLOCK_N,
                    BLOCK_K,
                )
                * scale
            )
            if HAS_BIAS:
                up += tl.load(b_at + N * s_bias_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            gate = _soft_bf16(acc, SOFT_RTNE).to(c_ptr.dtype.element_ty).to(tl.float32)
            up = _soft_bf16(up, SOFT_RTNE).to(c_ptr.dtype.element_ty).to(tl.float32)
            if ACT != 0:
                gate = tl.minimum(gate, LIMIT)
                up = tl.minimum(tl.maximum(up, -LIMIT), LIMIT)
            if ACT == 1:
                acc = (up + 1.0) * gate / (1.0 + tl.exp(-ALPHA * gate))
            else:
                acc = gate / (1.0 + tl.exp(-gate)) * up
        acc = _soft_bf16(acc, SOFT_RTNE)
        c_ptrs = c_ptr + rm[:, None].to(tl.int64) * s_cm + rn[None, :] * s_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm < row_end)[:, None] & n_ok[None, :])
    else:
        row0 = tl.reduce(ends, 0, _MAX) + (t - total) * BLOCK_M
        if row0 < M:  # rows past the last group: zeros
            rm = row0 + tl.arange(0, BLOCK_M)
            zero = tl.full((BLOCK_M, BLOCK_N), 0, c_ptr.dtype.element_ty)
            c_ptrs = c_ptr + rm[:, None].to(tl.int64) * s_cm + rn[None, :] * s_cn
            tl.store(c_ptrs, zero, mask=(rm < M)[:, None] & n_ok[None, :])
