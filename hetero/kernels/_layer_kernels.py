"""Triton kernels of the glue ops (private: the launchers live in ``hetero.kernels.layers``).

* ``rms_norm_kernel``: one program per tile of rows; the sum of squares is a float32 (float64
  for float64 inputs) reduction along the row, one pass when the row fits ``BLOCK_H``, else
  two streamed passes (sum of squares, then normalize), optionally fused with the residual add;
  the weight offset is a scalar argument, the gate (HAS_GATE) and its activation (SIGMOID_GATE,
  else SiLU) compile-time switches.
* ``layer_norm_kernel``: one program per tile of rows, three streamed passes (mean, biased variance
  about the mean, output), weight and optional bias (HAS_BIAS) read in their own dtype.
* ``rope_kernel``: one program per token; it loads the token's cos/sin row once and loops
  over tiles of query heads, then key heads (``_rope_heads``); dims past ``rot`` are copied
  through. A position outside [0, max_pos) reads nothing and rotates by angle 0.
* ``silu_and_mul_kernel``: a 2-D grid of (row tile, column tile) over [rows, I].

Outputs are rounded through ``cast_out`` (``hetero.kernels._rounding``). triton.language's
own jit helpers (``tl.sum``, ``tl.zeros``) are interpreted only if TRITON_INTERPRET was set
before triton's first import, so the kernels use builtins (``tl.reduce``, ``tl.full``) that
work whatever the import order.
"""

from __future__ import annotations

from hetero.kernels._rounding import cast_out
from hetero.kernels._triton import triton_modules

triton, tl = triton_modules()

__all__ = ["rms_norm_kernel", "layer_norm_kernel", "rope_kernel", "silu_and_mul_kernel"]


@triton.jit
def _add(a, b):
    return a + b


# The combine function of ``tl.sum``: the interpreter reduces it with NumPy (it recognizes it by
# identity) and a compiler emits the same reduction ``tl.sum`` does. ``_add`` is the fallback
# should a Triton version rename it (correct, but the interpreter then loops in Python).
_SUM_COMBINE = getattr(getattr(tl, "standard", None), "_sum_combine", None) or _add


@triton.jit
def _row_sum(x):
    """Sum along axis 1, as ``tl.sum(x, 1)``. Not ``tl.sum`` itself: it is a jit function of
    triton.language, interpreted only when TRITON_INTERPRET was set before triton's first
    import (a test session that imported triton earlier would fail with "Cannot call
    @triton.jit'd outside of the scope of a kernel"); ``tl.reduce`` is a builtin either way."""
    return tl.reduce(x, 1, _SUM_COMBINE)


@triton.jit
def _sigmoid(a):
    e = tl.exp(-tl.abs(a))  # without overflow: exp of a non-positive number only
    return tl.where(a >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


@triton.jit
def _norm_out(xf, inv, w, g_ptrs, m, DST: tl.constexpr, HAS_GATE: tl.constexpr, SIGMOID_GATE: tl.constexpr,
              RNE_BF16: tl.constexpr):  # fmt: skip
    """One tile of rms_norm's output in DST: ``xn * w`` (xn = xf * inv), or with the gate the spec's
    order ``r(r(r(xn) * w) * act(gate))`` (r: a rounding to DST, act on the gate in xf's dtype)."""
    xn = xf * inv[:, None]
    if HAS_GATE:
        xn = cast_out(xn, DST, RNE_BF16).to(xf.dtype)
        y = cast_out(xn * w[None, :], DST, RNE_BF16).to(xf.dtype)
        g = tl.load(g_ptrs, mask=m, other=0.0).to(xf.dtype)
        if SIGMOID_GATE:
            y = y * _sigmoid(g)
        else:
            y = y * (g * _sigmoid(g))
    else:
        y = xn * w[None, :]
    return cast_out(y, DST, RNE_BF16)


@triton.jit
def _h_tile(x_ptr, r_ptr, r, c, m, sx_r, sx_c, sr_r, sr_c,
            HAS_RES: tl.constexpr, ACC: tl.constexpr, RNE_BF16: tl.constexpr):  # fmt: skip
    """A tile of the normalized input in x's dtype: x, or ``h = x + residual`` rounded to x's dtype."""
    x = tl.load(x_ptr + r[:, None] * sx_r + c[None, :] * sx_c, mask=m, other=0.0)
    if HAS_RES:
        res = tl.load(r_ptr + r[:, None] * sr_r + c[None, :] * sr_c, mask=m, other=0.0)
        x = cast_out(x.to(ACC) + res.to(ACC), x_ptr.dtype.element_ty, RNE_BF16)
    return x


@triton.jit
def rms_norm_kernel(
    x_ptr, r_ptr, w_ptr, g_ptr, y_ptr, h_ptr,
    rows, hidden, eps, offset,
    sx_r, sx_c, sr_r, sr_c, sw, sg_r, sg_c, sy_r, sh_r,
    HAS_RES: tl.constexpr, HAS_GATE: tl.constexpr, SIGMOID_GATE: tl.constexpr, ACC: tl.constexpr,
    ONE_PASS: tl.constexpr, RNE_BF16: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    rm = r < rows
    cc = tl.arange(0, BLOCK_H)
    dst = y_ptr.dtype.element_ty
    if ONE_PASS:
        cm = cc < hidden
        m = rm[:, None] & cm[None, :]
        x = _h_tile(x_ptr, r_ptr, r, cc, m, sx_r, sx_c, sr_r, sr_c, HAS_RES, ACC, RNE_BF16)
        if HAS_RES:
            tl.store(h_ptr + r[:, None] * sh_r + cc[None, :], x, mask=m)
        xf = x.to(ACC)
        inv = 1.0 / tl.sqrt(_row_sum(xf * xf) / hidden + eps)
        w = tl.load(w_ptr + cc * sw, mask=cm, other=0.0).to(ACC) + offset
        y = _norm_out(
            xf, inv, w, g_ptr + r[:, None] * sg_r + cc[None, :] * sg_c, m, dst, HAS_GATE, SIGMOID_GATE, RNE_BF16
        )
        tl.store(y_ptr + r[:, None] * sy_r + cc[None, :], y, mask=m)
    else:
        ss = tl.full([BLOCK_R], 0.0, ACC)  # (tl.zeros is a triton.language jit function: see _row_sum)
        for c0 in range(0, hidden, BLOCK_H):
            c = c0 + cc
            m = rm[:, None] & (c < hidden)[None, :]
            x = _h_tile(x_ptr, r_ptr, r, c, m, sx_r, sx_c, sr_r, sr_c, HAS_RES, ACC, RNE_BF16)
            if HAS_RES:
                tl.store(h_ptr + r[:, None] * sh_r + c[None, :], x, mask=m)
            xf = x.to(ACC)
            ss += _row_sum(xf * xf)
        inv = 1.0 / tl.sqrt(ss / hidden + eps)
        for c0 in range(0, hidden, BLOCK_H):
            c = c0 + cc
            cm = c < hidden
            m = rm[:, None] & cm[None, :]
            # recompute h from the inputs rather than reading back this program's own stores
            x = _h_tile(x_ptr, r_ptr, r, c, m, sx_r, sx_c, sr_r, sr_c, HAS_RES, ACC, RNE_BF16)
            w = tl.load(w_ptr + c * sw, mask=cm, other=0.0).to(ACC) + offset
            y = _norm_out(
                x.to(ACC),
                inv,
                w,
                g_ptr + r[:, None] * sg_r + c[None, :] * sg_c,
                m,
                dst,
                HAS_GATE,
                SIGMOID_GATE,
                RNE_BF16,
            )
            tl.store(y_ptr + r[:, None] * sy_r + c[None, :], y, mask=m)


@triton.jit
def layer_norm_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, rows, hidden, eps, sx_r, sx_c, sw, sb, sy_r,
    HAS_BIAS: tl.constexpr, ACC: tl.constexpr, RNE_BF16: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    """Rows [BLOCK_R] of ``(x - mean) * rsqrt(var + eps) * w + b``: three streamed passes (mean, the
    biased variance about it, the output), one tile each when the row fits BLOCK_H."""
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    rm = r < rows
    cc = tl.arange(0, BLOCK_H)
    x_ptr += r[:, None] * sx_r
    total = tl.full([BLOCK_R], 0.0, ACC)
    for c0 in range(0, hidden, BLOCK_H):
        c = c0 + cc
        total += _row_sum(
            tl.load(x_ptr + c[None, :] * sx_c, mask=rm[:, None] & (c < hidden)[None, :], other=0.0).to(ACC)
        )
    mean = total / hidden
    ss = tl.full([BLOCK_R], 0.0, ACC)
    for c0 in range(0, hidden, BLOCK_H):
        c = c0 + cc
        m = rm[:, None] & (c < hidden)[None, :]
        xc = tl.where(m, tl.load(x_ptr + c[None, :] * sx_c, mask=m, other=0.0).to(ACC) - mean[:, None], 0.0)
        ss += _row_sum(xc * xc)
    inv = 1.0 / tl.sqrt(ss / hidden + eps)
    for c0 in range(0, hidden, BLOCK_H):
        c = c0 + cc
        cm = c < hidden
        m = rm[:, None] & cm[None, :]
        xn = (tl.load(x_ptr + c[None, :] * sx_c, mask=m, other=0.0).to(ACC) - mean[:, None]) * inv[:, None]
        y = xn * tl.load(w_ptr + c * sw, mask=cm, other=0.0).to(ACC)[None, :]
        if HAS_BIAS:
            y += tl.load(b_ptr + c * sb, mask=cm, other=0.0).to(ACC)[None, :]
        tl.store(y_ptr + r[:, None] * sy_r + c[None, :], cast_out(y, y_ptr.dtype.element_ty, RNE_BF16), mask=m)


@triton.jit
def _rope_heads(
    src_ptr, dst_ptr, t, cos, sin, num_heads, head_dim, rot,
    s_t, s_h, s_d, o_t, o_h,
    IS_NEOX: tl.constexpr, ACC: tl.constexpr, RNE_BF16: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
):  # fmt: skip
    """Rotate the heads of one token of one tensor (q or k) into dst; cos/sin [BLOCK_HALF]."""
    half = rot // 2
    i = tl.arange(0, BLOCK_HALF)
    im = i < half
    if IS_NEOX:
        d1 = i
        d2 = i + half
    else:
        d1 = 2 * i
        d2 = 2 * i + 1
    hh = tl.arange(0, BLOCK_H)
    pp = tl.arange(0, BLOCK_PASS)
    src = src_ptr + t * s_t
    dst = dst_ptr + t * o_t
    for h0 in range(0, num_heads, BLOCK_H):
        h = h0 + hh
        hm = h < num_heads
        m = hm[:, None] & im[None, :]
        x1 = tl.load(src + h[:, None] * s_h + d1[None, :] * s_d, mask=m, other=0.0).to(ACC)
        x2 = tl.load(src + h[:, None] * s_h + d2[None, :] * s_d, mask=m, other=0.0).to(ACC)
        y1 = x1 * cos[None, :] - x2 * sin[None, :]
        y2 = x2 * cos[None, :] + x1 * sin[None, :]
        tl.store(dst + h[:, None] * o_h + d1[None, :], cast_out(y1, dst_ptr.dtype.element_ty, RNE_BF16), mask=m)
        tl.store(dst + h[:, None] * o_h + d2[None, :], cast_out(y2, dst_ptr.dtype.element_ty, RNE_BF16), mask=m)
        for d0 in range(rot, head_dim, BLOCK_PASS):  # partial rotary: the rest passes through
            d = d0 + pp
            pm = hm[:, None] & (d < head_dim)[None, :]
            x = tl.load(src + h[:, None] * s_h + d[None, :] * s_d, mask=pm)
            tl.store(dst + h[:, None] * o_h + d[None, :], x.to(dst_ptr.dtype.element_ty), mask=pm)


@triton.jit
def rope_kernel(
    pos_ptr, cs_ptr, q_ptr, k_ptr, qo_ptr, ko_ptr,
    num_q_heads, num_k_heads, head_dim, rot, max_pos,
    s_pos, scs_p, scs_c,
    sq_t, sq_h, sq_d, sk_t, sk_h, sk_d,
    oq_t, oq_h, ok_t, ok_h,
    IS_NEOX: tl.constexpr, ACC: tl.constexpr, RNE_Q: tl.constexpr, RNE_K: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t * s_pos)
    half = rot // 2
    i = tl.arange(0, BLOCK_HALF)
    # a position outside [0, P) (checked on the host only for CPU tensors) reads no memory and
    # rotates by angle 0 (cos 1, sin 0) instead of faulting
    pos_ok = (pos >= 0) & (pos < max_pos)
    im = i < tl.where(pos_ok, half, 0)  # (not `& pos_ok`: the interpreter mistypes a scalar-bool broadcast)
    row = cs_ptr + tl.where(pos_ok, pos, 0) * scs_p
    cos = tl.load(row + i * scs_c, mask=im, other=1.0).to(ACC)
    sin = tl.load(row + (i + half) * scs_c, mask=im, other=0.0).to(ACC)
    _rope_heads(
        q_ptr,
        qo_ptr,
        t,
        cos,
        sin,
        num_q_heads,
        head_dim,
        rot,
        sq_t,
        sq_h,
        sq_d,
        oq_t,
        oq_h,
        IS_NEOX,
        ACC,
        RNE_Q,
        BLOCK_H,
        BLOCK_HALF,
        BLOCK_PASS,
    )
    _rope_heads(
        k_ptr,
        ko_ptr,
        t,
        cos,
        sin,
        num_k_heads,
        head_dim,
        rot,
        sk_t,
        sk_h,
        sk_d,
        ok_t,
        ok_h,
        IS_NEOX,
        ACC,
        RNE_K,
        BLOCK_H,
        BLOCK_HALF,
        BLOCK_PASS,
    )


@triton.jit
def silu_and_mul_kernel(
    x_ptr, y_ptr, rows, inter,
    sx_r, sx_c, sy_r,
    ACC: tl.constexpr, RNE_BF16: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(1).to(tl.int64) * BLOCK_I + tl.arange(0, BLOCK_I)
    m = (r < rows)[:, None] & (c < inter)[None, :]
    base = x_ptr + r[:, None] * sx_r
    a = tl.load(base + c[None, :] * sx_c, mask=m, other=0.0).to(ACC)
    b = tl.load(base + (c[None, :] + inter) * sx_c, mask=m, other=0.0).to(ACC)
    y = a * _sigmoid(a) * b
    tl.store(y_ptr + r[:, None] * sy_r + c[None, :], cast_out(y, y_ptr.dtype.element_ty, RNE_BF16), mask=m)
