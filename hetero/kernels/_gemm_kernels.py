"""Triton kernels of the GEMM family (private: the wrappers live in hetero.kernels.gemm and
hetero.kernels.moe).

* ``_gemm_kernel``: one program per [BLOCK_M, BLOCK_N] output tile, programs ordered in
  GROUP_M-row bands (the "grouped ordering" swizzle) so that consecutive programs share rows
  of ``a`` and columns of ``b`` in L2; K streamed in BLOCK_K steps into a float32 (float64
  for float64 inputs) accumulator; bias added in the epilogue; stored in the output dtype.
* ``_scaled_gemm_kernel``: the same tiling for fp8 / int8 operands. int8 accumulates
  exactly in int32. With 128-block scales each BLOCK_K step (BLOCK_K divides 128) is one
  fresh product scaled by its block's scales before it enters the float32 accumulator; fp8
  always takes a fresh product per step (promoted out of the MMA every BLOCK_K, which keeps
  Hopper's imprecise fp8 accumulation out of long reductions); per tensor / per row scales
  are applied once in the epilogue.
* ``_grouped_gemm_kernel``: one launch over every group without reading group_ends on the
  host. Axis 0 of the grid enumerates "work tiles" up to a bound known on the host
  (cdiv(M, BLOCK_M) + min(G + 1, M)); each program recomputes from group_ends, in
  registers, the tile counts per group (cdiv(rows, BLOCK_M)) and their prefix sum, finds
  the group its work tile belongs to and the rows [start, end) it covers, so that every
  tile lies inside one group (no tile straddles a boundary) and reads one expert's weight.
  Work tiles after the last group's cover the rows past group_ends[-1] and store zeros;
  surplus programs do nothing. The same kernel serves fused_moe: GATHER reads row r of
  ``a`` at ``x[perm[r] // TOPK]`` (the permutation is never materialized), SWIGLU computes
  the gate and up tiles of one column block together and stores silu(gate) * up.
  group_ends is untrusted: each end is clamped into [0, M] in registers (a decreasing end makes
  an empty group), and a gathered row whose perm entry lies outside the pairs reads as zeros.

Interpreter workarounds (constexpr flags, off on hardware): ``UPCAST`` converts bf16 dot
operands to float32 (the triton 3.9 interpreter miscomputes a bf16 ``tl.dot``);
``SOFT_RTNE`` rounds float32 to bfloat16 to nearest-even by hand before the conversion (the
interpreter truncates). The helpers are written inline, not as nested ``@triton.jit``
functions, because the interpreter re-patches triton.language on every nested call, which
made the K loop several times slower.
"""

from __future__ import annotations

from hetero.kernels._triton import triton_modules

triton, tl = triton_modules()

# Reductions and scans go through the builtins tl.reduce / tl.associative_scan with Triton's own
# combine functions, not tl.sum / tl.cumsum / tl.max (jit functions of triton.language): those
# are interpreted only if TRITON_INTERPRET was set before triton's first import (a test session
# that imported triton earlier fails with "Cannot call @triton.jit'd outside of the scope of a
# kernel"), and each nested jit call costs the interpreter a re-patch of triton.language. The
# interpreter maps these combine functions to NumPy; a compiler emits what tl.sum would. For the
# same reason tl.zeros / tl.cdiv are written as tl.full / integer arithmetic.
_SUM = tl.standard._sum_combine
_MAX = tl.standard._elementwise_max

#: scale forms of scaled_gemm, as constexpr codes
TENSOR, ROW, BLOCK = 0, 1, 2


@triton.jit
def _gemm_kernel(
    a_ptr, b_ptr, bias_ptr, c_ptr,
    M, N, K,
    s_am, s_ak, s_bn, s_bk, s_cm, s_cn,
    HAS_BIAS: tl.constexpr, ACC: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr, SOFT_RTNE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """c[M, N] = a[M, K] @ b[N, K].T (+ bias[N]), every operand through its strides."""
    # grouped ordering: column tiles advance within bands of GROUP_M row tiles
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
    a_ptrs = a_ptr + rm[:, None].to(tl.int64) * s_am + rk[None, :] * s_ak
    b_ptrs = b_ptr + rn[None, :].to(tl.int64) * s_bn + rk[:, None] * s_bk
    acc = tl.full((BLOCK_M, BLOCK_N), 0, ACC)
    for k0 in range(0, K, BLOCK_K):
        k_ok = rk < K - k0
        a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * s_ak
        b_ptrs += BLOCK_K * s_bk
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(ACC)[None, :]
    if SOFT_RTNE and c_ptr.dtype.element_ty == tl.bfloat16:
        bits = acc.to(tl.float32).to(tl.uint32, bitcast=True)
        acc = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
    c_ptrs = c_ptr + rm[:, None].to(tl.int64) * s_cm + rn[None, :] * s_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _scaled_gemm_kernel(
    a_ptr, b_ptr, as_ptr, bs_ptr, bias_ptr, c_ptr,
    M, N, K,
    s_am, s_ak, s_bn, s_bk, s_asm, s_ask, s_bsn, s_bsk, s_cm, s_cn,
    A_FORM: tl.constexpr, B_FORM: tl.constexpr, SCALE_BLOCK: tl.constexpr,
    IS_INT: tl.constexpr, HAS_BIAS: tl.constexpr, SOFT_RTNE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """c = dequant(a) @ dequant(b).T (+ bias): scales per tensor (0), row (1) or 128-block (2)."""
    BLOCKWISE: tl.constexpr = (A_FORM == 2) or (B_FORM == 2)
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
    a_ptrs = a_ptr + rm[:, None].to(tl.int64) * s_am + rk[None, :] * s_ak
    b_ptrs = b_ptr + rn[None, :].to(tl.int64) * s_bn + rk[:, None] * s_bk
    as_rows = as_ptr + rm.to(tl.int64) * s_asm  # a_scale rows: one per token (row and block forms)
    if B_FORM == 2:  # one b_scale row per SCALE_BLOCK output channels
        bs_rows = bs_ptr + (rn // SCALE_BLOCK).to(tl.int64) * s_bsn
    else:
        bs_rows = bs_ptr + rn.to(tl.int64) * s_bsn
    acc = tl.full((BLOCK_M, BLOCK_N), 0, tl.float32)
    acc_i = tl.full((BLOCK_M, BLOCK_N), 0, tl.int32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = rk < K - k0
        a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if IS_INT and not BLOCKWISE:
            acc_i = tl.dot(a, b, acc_i, out_dtype=tl.int32)  # exact over the whole of K
        else:
            if IS_INT:
                part = tl.dot(a, b, out_dtype=tl.int32).to(tl.float32)
            else:
                part = tl.dot(a, b)
            if BLOCKWISE:
                kb = k0 // SCALE_BLOCK
                if A_FORM == 2:
                    part *= tl.load(as_rows + kb * s_ask, mask=m_ok, other=0.0)[:, None]
                if B_FORM == 2:
                    part *= tl.load(bs_rows + kb * s_bsk, mask=n_ok, other=0.0)[None, :]
            acc += part
        a_ptrs += BLOCK_K * s_ak
        b_ptrs += BLOCK_K * s_bk
    if IS_INT and not BLOCKWISE:
        acc = acc_i.to(tl.float32)
    if A_FORM == 0:
        acc *= tl.load(as_ptr)
    elif A_FORM == 1:
        acc *= tl.load(as_rows, mask=m_ok, other=0.0)[:, None]
    if B_FORM == 0:
        acc *= tl.load(bs_ptr)
    elif B_FORM == 1:
        acc *= tl.load(bs_rows, mask=n_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if SOFT_RTNE and c_ptr.dtype.element_ty == tl.bfloat16:
        bits = acc.to(tl.uint32, bitcast=True)
        acc = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
    c_ptrs = c_ptr + rm[:, None].to(tl.int64) * s_cm + rn[None, :] * s_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _grouped_gemm_kernel(
    a_ptr, b_ptr, c_ptr, ends_ptr, perm_ptr, bias_ptr,
    M, N, K, G, TOPK, UP_OFF, A_ROWS, ALPHA, LIMIT,
    s_am, s_ak, s_bg, s_bn, s_bk, s_cm, s_cn, s_e, s_bias_g, s_bias_n,
    GATHER: tl.constexpr, SWIGLU: tl.constexpr, ACT: tl.constexpr, HAS_BIAS: tl.constexpr,
    ACC: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr, SOFT_RTNE: tl.constexpr, G_POW2: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Rows [ends[g-1], ends[g]) of c[M, N] = a_rows @ b[g].T; rows past ends[G-1] = 0.

    GATHER: a_rows[r] = a[perm[r] // TOPK]. HAS_BIAS: group g's bias row is added in ACC before
    any rounding (bias[g, n], and bias[g, n + N] for the up half). SWIGLU: c[r, n] = act(gate, up)
    with gate from b[g, n] and up from the element UP_OFF further (b[g, n + I]), each rounded to
    c's dtype first, as a GEMM storing gate_up followed by the activation would; ACT is the index
    in hetero.spec.moe.ACTIVATIONS (0 silu, 1 swigluoai with ALPHA and LIMIT, 2 swiglu_clamp with LIMIT).
    """
    t = tl.program_id(0)
    pid_n = tl.program_id(1)
    # ---- which group and rows this work tile covers (from group_ends, in registers)
    gi = tl.arange(0, G_POW2)
    g_ok = gi < G
    # group_ends is untrusted: clamped into [0, M], a decreasing end makes an empty group
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
        else:
            src = rm
        rk = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + src[:, None].to(tl.int64) * s_am + rk[None, :] * s_ak
        b_ptrs = b_ptr + g.to(tl.int64) * s_bg + rn[None, :].to(tl.int64) * s_bn + rk[:, None] * s_bk
        acc = tl.full((BLOCK_M, BLOCK_N), 0, ACC)
        acc_up = tl.full((BLOCK_M, BLOCK_N), 0, ACC)
        for k0 in range(0, K, BLOCK_K):
            k_ok = rk < K - k0
            b_mask = k_ok[:, None] & n_ok[None, :]
            a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=b_mask, other=0.0)
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            if IEEE:
                acc = tl.dot(a, b, acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc)
            if SWIGLU:
                b = tl.load(b_ptrs + UP_OFF, mask=b_mask, other=0.0)
                if UPCAST:
                    b = b.to(tl.float32)
                if IEEE:
                    acc_up = tl.dot(a, b, acc_up, input_precision="ieee")
                else:
                    acc_up = tl.dot(a, b, acc_up)
            a_ptrs += BLOCK_K * s_ak
            b_ptrs += BLOCK_K * s_bk
        if HAS_BIAS:  # g < G here, and the columns are masked
            b_at = bias_ptr + g.to(tl.int64) * s_bias_g + rn.to(tl.int64) * s_bias_n
            acc += tl.load(b_at, mask=n_ok, other=0.0).to(ACC)[None, :]
            if SWIGLU:
                acc_up += tl.load(b_at + N * s_bias_n, mask=n_ok, other=0.0).to(ACC)[None, :]
        if SWIGLU:
            if SOFT_RTNE and c_ptr.dtype.element_ty == tl.bfloat16:
                bits = acc.to(tl.float32).to(tl.uint32, bitcast=True)
                acc = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
                bits = acc_up.to(tl.float32).to(tl.uint32, bitcast=True)
                acc_up = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
            gate = acc.to(c_ptr.dtype.element_ty).to(ACC)
            up = acc_up.to(c_ptr.dtype.element_ty).to(ACC)
            if ACT != 0:
                gate = tl.minimum(gate, LIMIT)
                up = tl.minimum(tl.maximum(up, -LIMIT), LIMIT)
            if ACT == 1:
                acc = (up + 1.0) * gate / (1.0 + tl.exp(-ALPHA * gate))
            else:
                acc = gate / (1.0 + tl.exp(-gate)) * up
        if SOFT_RTNE and c_ptr.dtype.element_ty == tl.bfloat16:
            bits = acc.to(tl.float32).to(tl.uint32, bitcast=True)
            acc = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
        c_ptrs = c_ptr + rm[:, None].to(tl.int64) * s_cm + rn[None, :] * s_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm < row_end)[:, None] & n_ok[None, :])
    else:
        row0 = (
            tl.reduce(ends, 0, _MAX) + (t - total) * BLOCK_M
        )  # well-formed ends are non-decreasing: the max is ends[G-1]
        if row0 < M:  # rows past the last group: zeros
            rm = row0 + tl.arange(0, BLOCK_M)
            zero = tl.full((BLOCK_M, BLOCK_N), 0, c_ptr.dtype.element_ty)
            c_ptrs = c_ptr + rm[:, None].to(tl.int64) * s_cm + rn[None, :] * s_cn
            tl.store(c_ptrs, zero, mask=(rm < M)[:, None] & n_ok[None, :])
