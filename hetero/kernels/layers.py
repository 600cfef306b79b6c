"""Triton kernels of the glue ops: rms_norm (optionally fused with the residual add),
rotary_embedding (NeoX and interleaved pairs, partial rotary) and silu_and_mul.

Semantics: ``hetero.spec.layers``. Each kernel computes in float32 (float64 when an input is
float64) and rounds once to the input's dtype; inputs are read through their strides and
never modified; outputs are new contiguous tensors.

Launch shapes (what a GPU runs):

* rms_norm: one program per tile of rows (one row when the hidden size is large, several
  for small rows such as the per-head q/k norm); the sum of squares is a float32 reduction
  along the row. Rows up to ``MAX_ROW_BLOCK`` elements stay in registers (one pass);
  longer rows are streamed twice (sum of squares, then normalize).
* rotary_embedding: one program per token; it loads the token's cos/sin row once and
  loops over tiles of query heads, then key heads; dims past ``rot`` are copied through.
  A position outside [0, max_pos) is masked: it reads nothing and rotates by angle 0.
* silu_and_mul: a 2-D grid of (row tile, column tile) over [rows, I].

Tiles come from the tuning table: "rows" (num_warps, optional ``BLOCK`` elements per
program) for rms_norm, "elementwise" (``BLOCK``) for the other two.

Two interpreter facts (triton 3.9) shape the code: the interpreter converts float32 to
bfloat16 by truncation where a GPU rounds to nearest even, so bf16 outputs go through
``cast_out`` (exact emulation under the interpreter, a plain cast on a device); and
triton.language's own jit helpers (``tl.sum``, ``tl.zeros``) are interpreted only if
TRITON_INTERPRET was set before triton's first import, so the kernels use builtins
(``tl.reduce``, ``tl.full``) that work whatever the import order.
"""
from __future__ import annotations


import torch

from hetero.kernels._triton import interpreter_requested, triton_modules
from hetero.kernels.tuning import Tuning
from hetero.spec.checks import check_at_least_1d, check_rms_norm, check_rotary, expect
from hetero.spec.types import FLOAT_DTYPES

triton, tl = triton_modules()

__all__ = ["rms_norm", "rotary_embedding", "silu_and_mul", "cast_out", "rne_bf16"]

#: rms_norm keeps a whole row in registers up to this many elements (hidden 16384 fits).
MAX_ROW_BLOCK = 16384
#: rms_norm packs rows into one program up to this many elements, unless "rows" sets BLOCK.
ROW_TILE = 4096
ROW_TILE_INTERPRETED = 16384  # the interpreter pays per program: fewer, bigger tiles


def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def _acc(*tensors: torch.Tensor | None):
    return tl.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else tl.float32


def _rows2d(x: torch.Tensor) -> torch.Tensor:
    """x [..., H] as [R, H]: a view whenever the leading dims collapse (any inner stride is
    kept: the kernels read it), else a copy."""
    return x.reshape(-1, x.shape[-1]) if x.ndim != 2 else x


# ----------------------------------------------------------------------------- kernels


@triton.jit
def cast_out(x, DST: tl.constexpr, RNE_BF16: tl.constexpr):
    """``x.to(DST)``. With RNE_BF16 (set under the interpreter when DST is bfloat16) the float32 ->
    bfloat16 rounding is done by hand, to nearest even as a GPU's convert does: triton 3.9's
    interpreter truncates instead, which would make the interpreter's bf16 results differ
    from the GPU's by up to one ulp (and break the exact ``h = x + residual`` of rms_norm)."""
    if RNE_BF16:
        xf = x.to(tl.float32)
        bits = xf.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        y = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        return tl.where(xf != xf, xf.to(tl.bfloat16), y)  # NaN stays NaN
    else:
        return x.to(DST)


def rne_bf16(dtype: torch.dtype, tuning: Tuning) -> bool:
    """The RNE_BF16 flag of ``cast_out`` for an output of ``dtype``: bfloat16 under the interpreter
    (harmless elsewhere: the emulation is bit-exact, only slower)."""
    return dtype == torch.bfloat16 and (tuning.interpreted or interpreter_requested())


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
def _rms_norm_kernel(
    x_ptr, r_ptr, w_ptr, y_ptr, h_ptr,
    rows, hidden, eps,
    sx_r, sx_c, sr_r, sr_c, sw, sy_r, sh_r,
    HAS_RES: tl.constexpr, ACC: tl.constexpr, ONE_PASS: tl.constexpr, RNE_BF16: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    rm = r < rows
    cc = tl.arange(0, BLOCK_H)
    if ONE_PASS:
        cm = cc < hidden
        m = rm[:, None] & cm[None, :]
        x = tl.load(x_ptr + r[:, None] * sx_r + cc[None, :] * sx_c, mask=m, other=0.0)
        if HAS_RES:
            res = tl.load(r_ptr + r[:, None] * sr_r + cc[None, :] * sr_c, mask=m, other=0.0)
            x = cast_out(x.to(ACC) + res.to(ACC), x_ptr.dtype.element_ty, RNE_BF16)  # h rounded to x's dtype
            tl.store(h_ptr + r[:, None] * sh_r + cc[None, :], x, mask=m)
        xf = x.to(ACC)
        inv = 1.0 / tl.sqrt(_row_sum(xf * xf) / hidden + eps)
        w = tl.load(w_ptr + cc * sw, mask=cm, other=0.0).to(ACC)
        y = xf * inv[:, None] * w[None, :]
        tl.store(y_ptr + r[:, None] * sy_r + cc[None, :], cast_out(y, y_ptr.dtype.element_ty, RNE_BF16), mask=m)
    else:
        ss = tl.full([BLOCK_R], 0.0, ACC)  # (tl.zeros is a triton.language jit function: see _row_sum)
        for c0 in range(0, hidden, BLOCK_H):
            c = c0 + cc
            m = rm[:, None] & (c < hidden)[None, :]
            x = tl.load(x_ptr + r[:, None] * sx_r + c[None, :] * sx_c, mask=m, other=0.0)
            if HAS_RES:
                res = tl.load(r_ptr + r[:, None] * sr_r + c[None, :] * sr_c, mask=m, other=0.0)
                x = cast_out(x.to(ACC) + res.to(ACC), x_ptr.dtype.element_ty, RNE_BF16)
                tl.store(h_ptr + r[:, None] * sh_r + c[None, :], x, mask=m)
            xf = x.to(ACC)
            ss += _row_sum(xf * xf)
        inv = 1.0 / tl.sqrt(ss / hidden + eps)
        for c0 in range(0, hidden, BLOCK_H):
            c = c0 + cc
            cm = c < hidden
            m = rm[:, None] & cm[None, :]
            # recompute h from the inputs rather than reading back this program's own stores
            x = tl.load(x_ptr + r[:, None] * sx_r + c[None, :] * sx_c, mask=m, other=0.0)
            if HAS_RES:
                res = tl.load(r_ptr + r[:, None] * sr_r + c[None, :] * sr_c, mask=m, other=0.0)
                x = cast_out(x.to(ACC) + res.to(ACC), x_ptr.dtype.element_ty, RNE_BF16)
            w = tl.load(w_ptr + c * sw, mask=cm, other=0.0).to(ACC)
            y = x.to(ACC) * inv[:, None] * w[None, :]
            tl.store(y_ptr + r[:, None] * sy_r + c[None, :], cast_out(y, y_ptr.dtype.element_ty, RNE_BF16), mask=m)


@triton.jit
def _rope_heads(
    src_ptr, dst_ptr, t, cos, sin, num_heads, head_dim, rot,
    s_t, s_h, s_d, o_t, o_h,
    IS_NEOX: tl.constexpr, ACC: tl.constexpr, RNE_BF16: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
):
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
def _rope_kernel(
    pos_ptr, cs_ptr, q_ptr, k_ptr, qo_ptr, ko_ptr,
    num_q_heads, num_k_heads, head_dim, rot, max_pos,
    s_pos, scs_p, scs_c,
    sq_t, sq_h, sq_d, sk_t, sk_h, sk_d,
    oq_t, oq_h, ok_t, ok_h,
    IS_NEOX: tl.constexpr, ACC: tl.constexpr, RNE_Q: tl.constexpr, RNE_K: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
):
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
    _rope_heads(q_ptr, qo_ptr, t, cos, sin, num_q_heads, head_dim, rot, sq_t, sq_h, sq_d, oq_t, oq_h,
                IS_NEOX, ACC, RNE_Q, BLOCK_H, BLOCK_HALF, BLOCK_PASS)
    _rope_heads(k_ptr, ko_ptr, t, cos, sin, num_k_heads, head_dim, rot, sk_t, sk_h, sk_d, ok_t, ok_h,
                IS_NEOX, ACC, RNE_K, BLOCK_H, BLOCK_HALF, BLOCK_PASS)


@triton.jit
def _silu_and_mul_kernel(
    x_ptr, y_ptr, rows, inter,
    sx_r, sx_c, sy_r,
    ACC: tl.constexpr, RNE_BF16: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(1).to(tl.int64) * BLOCK_I + tl.arange(0, BLOCK_I)
    m = (r < rows)[:, None] & (c < inter)[None, :]
    base = x_ptr + r[:, None] * sx_r
    a = tl.load(base + c[None, :] * sx_c, mask=m, other=0.0).to(ACC)
    b = tl.load(base + (c[None, :] + inter) * sx_c, mask=m, other=0.0).to(ACC)
    e = tl.exp(-tl.abs(a))  # sigmoid without overflow: exp of a non-positive number only
    sig = tl.where(a >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    y = a * sig * b
    tl.store(y_ptr + r[:, None] * sy_r + c[None, :], cast_out(y, y_ptr.dtype.element_ty, RNE_BF16), mask=m)


# ----------------------------------------------------------------------------- launchers


def rms_norm(x, weight, eps, *, residual=None, tuning: Tuning):
    op = "rms_norm"
    hidden = check_rms_norm(op, x, weight, eps, residual)

    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    h = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else None
    rows = x.numel() // hidden if hidden else 0
    if rows and hidden:
        x2 = _rows2d(x)
        r2 = _rows2d(residual) if residual is not None else x2
        y2 = y.view(-1, hidden)
        h2 = h.view(-1, hidden) if h is not None else y2
        meta, launch = Tuning.launch_options(tuning("rows"))
        tile = int(meta.get("BLOCK", ROW_TILE_INTERPRETED if tuning.interpreted else ROW_TILE))
        bh = min(_pow2(hidden), MAX_ROW_BLOCK)
        one_pass = bh >= hidden
        br = max(1, min(_pow2(rows), tile // bh))
        if not tuning.interpreted and "num_warps" in launch:
            # at least one warp per 1024 elements of the tile, so a long row does not spill
            launch["num_warps"] = min(16, max(int(launch["num_warps"]), (br * bh) // 1024))
        _rms_norm_kernel[(triton.cdiv(rows, br),)](
            x2, r2, weight, y2, h2,
            rows, hidden, float(eps),
            x2.stride(0), x2.stride(1), r2.stride(0), r2.stride(1), weight.stride(0), y2.stride(0), h2.stride(0),
            HAS_RES=residual is not None, ACC=_acc(x, weight), ONE_PASS=one_pass, RNE_BF16=rne_bf16(x.dtype, tuning),
            BLOCK_R=br, BLOCK_H=bh, **launch,
        )
    return y if residual is None else (y, h)


def rotary_embedding(positions, q, k, cos_sin_cache, *, is_neox=True, tuning: Tuning):
    tokens, head_dim, max_pos, rot = check_rotary("rotary_embedding", positions, q, k, cos_sin_cache, is_neox,
                                                  read_positions=False)  # hetero.spec.validate's, when on
    hq = q.shape[1]

    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    hk = k.shape[1]
    if tokens == 0 or (hq == 0 and hk == 0):
        return q_out, k_out
    meta, launch = Tuning.launch_options(tuning("elementwise"))
    block = int(meta.get("BLOCK", 1024))
    b_half = _pow2(rot // 2)
    b_pass = min(_pow2(head_dim - rot), block) if head_dim > rot else 1
    bh = max(1, min(_pow2(max(hq, hk)), block // max(2 * b_half, b_pass)))
    _rope_kernel[(tokens,)](
        positions, cos_sin_cache, q, k, q_out, k_out,
        hq, hk, head_dim, rot, max_pos,
        positions.stride(0), *cos_sin_cache.stride(),
        *q.stride(), *k.stride(),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
        IS_NEOX=is_neox, ACC=_acc(q, k, cos_sin_cache), RNE_Q=rne_bf16(q.dtype, tuning), RNE_K=rne_bf16(k.dtype, tuning),
        BLOCK_H=bh, BLOCK_HALF=b_half, BLOCK_PASS=b_pass, **launch,
    )
    return q_out, k_out


def silu_and_mul(x, *, tuning: Tuning) -> torch.Tensor:
    op = "silu_and_mul"
    check_at_least_1d(op, "x", x, FLOAT_DTYPES)
    width = x.shape[-1]
    expect(width % 2 == 0, op, "x", "an even last dimension (2I)", f"shape {list(x.shape)}")
    inter = width // 2
    y = torch.empty((*x.shape[:-1], inter), dtype=x.dtype, device=x.device)
    rows = x.numel() // width if width else 0
    if rows == 0 or inter == 0:
        return y
    x2 = _rows2d(x)
    meta, launch = Tuning.launch_options(tuning("elementwise"))
    block = int(meta.get("BLOCK", 1024))
    bi = min(_pow2(inter), block)
    br = max(1, min(_pow2(rows), block // bi))
    grid = (triton.cdiv(rows, br), triton.cdiv(inter, bi))
    _silu_and_mul_kernel[grid](
        x2, y.view(-1, inter), rows, inter,
        x2.stride(0), x2.stride(1), inter,
        ACC=_acc(x), RNE_BF16=rne_bf16(x.dtype, tuning), BLOCK_R=br, BLOCK_I=bi, **launch,
    )
    return y
