"""Triton kernels of quantize_activation (private: the launcher lives in ``hetero.kernels.quant``).

Everything that must be bit-exact is integer arithmetic on float32 bit patterns, so that the
interpreter (whose float8 conversion rounds half up) and every compiler agree with the reference:

* ``fp8_bits``: float32 -> e4m3fn (bias 7, NaN 0x7F/0xFF) or e4m3fnuz (bias 8, no negative
  zero, 0x80 is NaN) byte, rounded to nearest, ties to even, subnormals included;
* ``rne_int``: float32 -> the nearest integer, ties to even (int8 and the zero point);
* ``pow2_ceil``: the smallest power of two >= a positive normal float32 (ue8m0 scales);
* divisions are ``tl.div_rn`` (correctly rounded; a plain ``/`` is approximate on NVIDIA).

``quantize_kernel``: grid (row tile, group). A program streams its group's columns in
``BLOCK_K`` chunks twice: once for the absolute maximum (or min and max), once to quantize and
store. With 128-column groups the chunk is the group and the second pass re-reads it from L1/L2.
"""

from __future__ import annotations

from hetero.kernels._triton import triton_modules

triton, tl = triton_modules()

__all__ = ["fp8_bits", "rne_int", "pow2_ceil", "quantize_kernel", "FN", "FNUZ", "INT8"]

_MAX = tl.standard._elementwise_max
_MIN = tl.standard._elementwise_min
#: quantize_kernel's MODE codes
FN, FNUZ, INT8 = 0, 1, 2


@triton.jit
def fp8_bits(y, UZ: tl.constexpr):
    """The e4m3fn (UZ false) or e4m3fnuz (UZ true) byte of float32 ``y`` (finite, |y| within the
    format's range), rounded to nearest even, as int32 in [0, 255]."""
    if UZ:  # smallest normal 2**-7 (float32 exponent field 120); subnormals are multiples of 2**-10
        MIN_E: tl.constexpr = 120
        OFF: tl.constexpr = 952  # (127 - 8) << 3: float32 exponent -> e4m3fnuz exponent, in mantissa units
        SHIFT: tl.constexpr = 140
    else:  # smallest normal 2**-6 (field 121); subnormals are multiples of 2**-9
        MIN_E: tl.constexpr = 121
        OFF: tl.constexpr = 960
        SHIFT: tl.constexpr = 141
    b = y.to(tl.int32, bitcast=True)
    a = b & 0x7FFFFFFF
    e = a >> 23
    normal = ((a + 0x7FFFF + ((a >> 20) & 1)) >> 20) - OFF
    m = (a & 0x7FFFFF) | 0x800000
    s = tl.minimum(tl.maximum(SHIFT - e, 21), 25)
    sub = (m + (1 << (s - 1)) - 1 + ((m >> s) & 1)) >> s
    sub = tl.where(e == 0, 0, sub)
    mag = tl.where(e >= MIN_E, normal, sub)
    sign = (b >> 24) & 0x80
    if UZ:
        sign = tl.where(mag == 0, 0, sign)  # no negative zero: 0x80 is NaN
    return sign | mag


@triton.jit
def rne_int(y):
    """float32 ``y`` (|y| < 2**23) rounded to the nearest integer, ties to even, as int32."""
    b = y.to(tl.int32, bitcast=True)
    a = b & 0x7FFFFFFF
    e = a >> 23
    m = (a & 0x7FFFFF) | 0x800000  # |y| = m * 2**(e - 150)
    s = tl.minimum(tl.maximum(150 - e, 1), 25)
    r = (m + (1 << (s - 1)) - 1 + ((m >> s) & 1)) >> s
    r = tl.where(e == 0, 0, r)
    return tl.where(b < 0, -r, r)


@triton.jit
def pow2_ceil(s):
    """The smallest power of two >= the positive normal float32 ``s``, exactly."""
    b = s.to(tl.int32, bitcast=True)
    return ((b + 0x7FFFFF) & 0x7F800000).to(tl.float32, bitcast=True)


@triton.jit
def quantize_kernel(
    x_ptr, q_ptr, s_ptr, zp_ptr,
    M, K, GS,
    s_xm, s_xk, s_qm, s_qk, s_sm, s_sg, s_zm, s_zg,
    QMAX: tl.constexpr, MODE: tl.constexpr, ASYM: tl.constexpr, UE8M0: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """q, scale (and zero point) of rows [BLOCK_M tile] x group ``program_id(1)`` of x [M, K]."""
    rm = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    g = tl.program_id(1)
    m_ok = rm < M
    col0 = g.to(tl.int64) * GS
    width = tl.minimum(K - col0, GS)
    rk = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + rm[:, None] * s_xm
    hi = tl.full((BLOCK_M,), 0.0, tl.float32)  # with ASYM, starting at 0 keeps 0 in the range (the spec's rule)
    lo = tl.full((BLOCK_M,), 0.0, tl.float32)
    for k0 in range(0, width, BLOCK_K):
        ok = m_ok[:, None] & (rk < width - k0)[None, :]
        x = tl.load(x_rows + (col0 + k0 + rk)[None, :] * s_xk, mask=ok, other=0.0).to(tl.float32)
        if ASYM:
            hi = tl.maximum(hi, tl.reduce(tl.where(ok, x, float("-inf")), 1, _MAX))
            lo = tl.minimum(lo, tl.reduce(tl.where(ok, x, float("inf")), 1, _MIN))
        else:
            hi = tl.maximum(hi, tl.reduce(tl.abs(x), 1, _MAX))
    if ASYM:
        s = tl.div_rn(tl.maximum(hi - lo, 1e-10), tl.full((BLOCK_M,), 255.0, tl.float32))
    else:
        s = tl.div_rn(tl.maximum(hi, 1e-10), tl.full((BLOCK_M,), QMAX, tl.float32))
    if UE8M0:
        s = pow2_ceil(s)
    tl.store(s_ptr + rm * s_sm + g * s_sg, s, mask=m_ok)
    if ASYM:
        zp = rne_int(-128.0 - tl.div_rn(lo, s))
        zp = tl.minimum(tl.maximum(zp, -128), 127)
        tl.store(zp_ptr + rm * s_zm + g * s_zg, zp, mask=m_ok)
    for k0 in range(0, width, BLOCK_K):
        cols = col0 + k0 + rk
        ok = m_ok[:, None] & (rk < width - k0)[None, :]
        x = tl.load(x_rows + cols[None, :] * s_xk, mask=ok, other=0.0).to(tl.float32)
        y = tl.div_rn(x, tl.broadcast_to(s[:, None], (BLOCK_M, BLOCK_K)))
        if ASYM:
            q = tl.minimum(tl.maximum(rne_int(y) + zp[:, None], -128), 127).to(tl.int8)
        else:
            y = tl.minimum(tl.maximum(y, -QMAX), QMAX)
            if MODE == 2:
                q = tl.minimum(tl.maximum(rne_int(y), -128), 127).to(tl.int8)
            else:
                q = fp8_bits(y, MODE == 1).to(tl.uint8)
        tl.store(q_ptr + rm[:, None] * s_qm + cols[None, :] * s_qk, q, mask=ok)
