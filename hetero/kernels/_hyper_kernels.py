"""Triton kernels of the hyper-connection ops (private: the launchers live in ``hetero.kernels.hyper``).

* ``hc_mix_kernel``: one program per token; streams the token's N*D elements (through the
  streams' strides) against tiles of ``fn`` [M, BLOCK_K], accumulating the M dot products and
  the sum of squares, then writes ``mixes = dots * rsqrt(mean(x**2) + norm_eps)`` [M] to a
  scratch row (float32, float64 for float64 inputs).
* ``hc_weights_kernel``: one program per BLOCK_T tokens; from their mixes rows it computes pre (and
  with HAS_POST the post weights, with SINKHORN the comb matrices: softmax over each row, then
  column and row normalizations in registers, ``iters`` a runtime count) for the whole block at
  once: the N x N work of one token is too small to give a program of its own.
* ``hc_apply_kernel``: one program per token, the collapse ``x = sum_i pre_i * streams_i`` over tiles
  of D, rounded once (``cast_out``). hc_pre and hc_head share both.
* ``hc_post_kernel``: a 2-D grid of (token, tile of D); ``out[i] = post_i * y + sum_j comb[j, i]
  * streams_j`` (or ``+ streams_i`` without comb), rounded once.

Every load is masked by the tensors' own shapes (no index is read from a tensor), so no input
reads or writes outside its tensors. Reductions use ``tl.reduce`` (see ``_layer_kernels``).
"""

from __future__ import annotations

from hetero.kernels._layer_kernels import _SUM_COMBINE, _row_sum, _sigmoid
from hetero.kernels._rounding import cast_out
from hetero.kernels._triton import triton_modules

triton, tl = triton_modules()

__all__ = ["hc_mix_kernel", "hc_weights_kernel", "hc_apply_kernel", "hc_post_kernel"]

_MAX = tl.standard._elementwise_max


@triton.jit
def _col_sum(x):
    """Sum along axis 0 (``tl.sum(x, 0)``; see ``_row_sum`` for why not ``tl.sum``)."""
    return tl.reduce(x, 0, _SUM_COMBINE)


@triton.jit
def hc_mix_kernel(
    s_ptr, fn_ptr, mix_ptr,
    D, K, M, norm_eps,
    s_t, s_n, s_d, fn_m, fn_k, mix_t,
    ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    m = tl.arange(0, BLOCK_M)
    mm = m < M
    kk = tl.arange(0, BLOCK_K)
    dots = tl.full([BLOCK_M, BLOCK_K], 0.0, ACC)
    ss = tl.full([BLOCK_K], 0.0, ACC)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + kk
        km = k < K
        i = k // D
        x = tl.load(s_ptr + t * s_t + i * s_n + (k - i * D) * s_d, mask=km, other=0.0).to(ACC)
        w = tl.load(fn_ptr + m[:, None] * fn_m + k[None, :] * fn_k, mask=mm[:, None] & km[None, :], other=0.0)
        dots += w.to(ACC) * x[None, :]
        ss += x * x
    inv = 1.0 / tl.sqrt(tl.reduce(ss, 0, _SUM_COMBINE) / K + norm_eps)
    tl.store(mix_ptr + t * mix_t + m, _row_sum(dots) * inv, mask=mm)


@triton.jit
def _weights(rows, base_ptr, base_s, scale, at, i, im, m2, ACC: tl.constexpr):
    """sigmoid(mixes[t, at + i] * scale + base[at + i]) for [BLOCK_T, BLOCK_N] (0 outside the tokens and N)."""
    logit = tl.load(rows + at + i[None, :], mask=m2, other=0.0).to(ACC) * scale
    logit += tl.load(base_ptr + (at + i) * base_s, mask=im, other=0.0).to(ACC)[None, :]
    return tl.where(m2, _sigmoid(logit), 0.0)


@triton.jit
def _sum3(x, axis: tl.constexpr):
    return tl.reduce(x, axis, _SUM_COMBINE)


@triton.jit
def _sinkhorn(rows, base_ptr, base_s, scale, N, hc_eps, iters, i, tm, im, ACC: tl.constexpr):
    """hc_pre's comb [BLOCK_T, BLOCK_N, BLOCK_N] (0 outside): softmax rows + eps, columns, then rows/columns."""
    cols = im[None, None, :]
    m3 = tm[:, None, None] & im[None, :, None] & cols
    at = 2 * N + i[:, None] * N + i[None, :]
    logit = tl.load(rows[:, :, None] + at[None, :, :], mask=m3, other=0.0).to(ACC) * scale
    logit += tl.load(base_ptr + at * base_s, mask=im[:, None] & im[None, :], other=0.0).to(ACC)[None, :, :]
    logit = tl.where(cols, logit, float("-inf"))  # padded columns leave the softmax
    e = tl.exp(logit - tl.reduce(logit, 2, _MAX)[:, :, None])
    c = tl.where(m3, e / _sum3(e, 2)[:, :, None] + hc_eps, 0.0)
    # padded rows and columns divide by 1, not by their own zero sums (hc_eps may be 0)
    c = c / tl.where(cols, _sum3(c, 1)[:, None, :] + hc_eps, 1.0)
    for _ in range(1, iters):
        c = c / tl.where(im[None, :, None], _sum3(c, 2)[:, :, None] + hc_eps, 1.0)
        c = c / tl.where(cols, _sum3(c, 1)[:, None, :] + hc_eps, 1.0)
    return c


@triton.jit
def hc_weights_kernel(
    mix_ptr, scale_ptr, base_ptr, pre_ptr, post_ptr, comb_ptr,
    T, N, hc_eps, post_mult, post_eps, iters,
    mix_t, scale_s, base_s, pre_t, post_t, comb_t,
    HAS_POST: tl.constexpr, SINKHORN: tl.constexpr, ACC: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    tm = t < T
    i = tl.arange(0, BLOCK_N)
    im = i < N
    m2 = tm[:, None] & im[None, :]
    rows = mix_ptr + t[:, None] * mix_t
    pre = _weights(rows, base_ptr, base_s, tl.load(scale_ptr).to(ACC), 0, i, im, m2, ACC)
    tl.store(pre_ptr + t[:, None] * pre_t + i[None, :], pre + hc_eps, mask=m2)
    if HAS_POST:
        post = _weights(rows, base_ptr, base_s, tl.load(scale_ptr + scale_s).to(ACC), N, i, im, m2, ACC)
        tl.store(post_ptr + t[:, None] * post_t + i[None, :], post_mult * post + post_eps, mask=m2)
    if SINKHORN:
        c = _sinkhorn(
            rows, base_ptr, base_s, tl.load(scale_ptr + 2 * scale_s).to(ACC), N, hc_eps, iters, i, tm, im, ACC
        )
        m3 = tm[:, None, None] & im[None, :, None] & im[None, None, :]
        tl.store(comb_ptr + t[:, None, None] * comb_t + (i[:, None] * N + i[None, :])[None, :, :], c, mask=m3)


@triton.jit
def hc_apply_kernel(
    s_ptr, pre_ptr, x_ptr,
    N, D,
    s_t, s_n, s_d, pre_t, x_t,
    ACC: tl.constexpr, RNE_BF16: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK_N)
    im = i < N
    pre = tl.load(pre_ptr + t * pre_t + i, mask=im, other=0.0).to(ACC)
    dd = tl.arange(0, BLOCK_D)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + dd
        dm = d < D
        s = tl.load(s_ptr + t * s_t + i[:, None] * s_n + d[None, :] * s_d, mask=im[:, None] & dm[None, :], other=0.0)
        x = _col_sum(pre[:, None] * s.to(ACC))
        tl.store(x_ptr + t * x_t + d, cast_out(x, x_ptr.dtype.element_ty, RNE_BF16), mask=dm)


@triton.jit
def hc_post_kernel(
    y_ptr, s_ptr, post_ptr, comb_ptr, out_ptr,
    N, D,
    y_t, y_d, s_t, s_n, s_d, p_t, p_n, c_t, c_j, c_i, o_t, o_n,
    HAS_COMB: tl.constexpr, ACC: tl.constexpr, RNE_BF16: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dm = d < D
    i = tl.arange(0, BLOCK_N)
    im = i < N
    m2 = im[:, None] & dm[None, :]
    y = tl.load(y_ptr + t * y_t + d * y_d, mask=dm, other=0.0).to(ACC)
    p = tl.load(post_ptr + t * p_t + i * p_n, mask=im, other=0.0).to(ACC)
    out = p[:, None] * y[None, :]
    if HAS_COMB:
        for j in range(0, N):  # out[i] += comb[j, i] * streams[j]: comb^T @ streams
            sj = tl.load(s_ptr + t * s_t + j * s_n + d * s_d, mask=dm, other=0.0).to(ACC)
            cj = tl.load(comb_ptr + t * c_t + j * c_j + i * c_i, mask=im, other=0.0).to(ACC)
            out += cj[:, None] * sj[None, :]
    else:
        out += tl.load(s_ptr + t * s_t + i[:, None] * s_n + d[None, :] * s_d, mask=m2, other=0.0).to(ACC)
    tl.store(
        out_ptr + t * o_t + i[:, None] * o_n + d[None, :], cast_out(out, out_ptr.dtype.element_ty, RNE_BF16), mask=m2
    )
