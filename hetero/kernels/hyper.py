"""Triton kernels of the hyper-connection ops (spec 1.7): hc_pre, hc_post, hc_head.

Semantics: ``hetero.spec.hyper``. Each kernel computes in float32 (float64 when an input is float64)
and rounds x / out once to the streams' dtype; inputs are read through their strides and never
modified; outputs are new contiguous tensors.

Launch shapes (what a GPU runs):

* hc_pre and hc_head: three launches. ``hc_mix_kernel`` (one program per token) reduces the token's
  N*D elements against ``fn`` into M mixes (M = 2N, N*(N+2) or N) in a float32 scratch [T, M];
  ``hc_weights_kernel`` (one program per block of tokens, up to 4096 / N**2 of them) turns them into
  pre, post and comb (Sinkhorn in registers, [BLOCK_T, N, N]); ``hc_apply_kernel`` (one program per
  token) collapses the streams by pre over tiles of D. ``fn`` is read once per token (from L2 on a GPU: 1.5 MB for
  DeepSeek-V4); a matrix-core form over tiles of tokens is left for a tuned kernel.
* hc_post: a 2-D grid of (token, tile of D), the N streams of the tile in registers.

Tiles come from the tuning table's "elementwise" entry (``BLOCK``, num_warps): BLOCK_D = BLOCK
elements of D, and hc_mix's [M, BLOCK_K] tile holds about 4 * BLOCK elements. The kernels are in
``hetero.kernels._hyper_kernels``.
"""

from __future__ import annotations

import torch

from hetero.kernels import _hyper_kernels as kern
from hetero.kernels._rounding import rne_bf16
from hetero.kernels._triton import triton_modules
from hetero.kernels.tuning import Tuning
from hetero.spec.checks import check_hc_head, check_hc_post, check_hc_pre

triton, tl = triton_modules()

__all__ = ["hc_pre", "hc_post", "hc_head"]


def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def _acc(*tensors: torch.Tensor | None) -> torch.dtype:
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def _tl(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def _collapse(streams, fn, scale, base, norm_eps, hc_eps, *, post_mult, post_eps, iters, has_post, tuning):
    """x [T, D] and the float32 weights post [T, N] and comb [T, N, N] (empty unless asked)."""
    t, n, d = streams.shape
    acc = _acc(streams, fn, scale, base)
    x = torch.empty((t, d), dtype=streams.dtype, device=streams.device)
    post = torch.empty((t, n if has_post else 0), dtype=acc, device=streams.device)
    comb = torch.empty((t, n, n) if iters else (t, 0, 0), dtype=acc, device=streams.device)
    if t == 0:
        return x, post, comb
    m = fn.shape[0]
    mixes = torch.empty((t, m), dtype=acc, device=streams.device)
    meta, launch = Tuning.launch_options(tuning("elementwise"))
    block = int(meta.get("BLOCK", 1024))
    bm = _pow2(m)
    bk = min(_pow2(n * d), max(16, 4 * block // bm))
    kern.hc_mix_kernel[(t,)](
        streams, fn, mixes,
        d, n * d, m, float(norm_eps),
        *streams.stride(), *fn.stride(), mixes.stride(0),
        ACC=_tl(acc), BLOCK_M=bm, BLOCK_K=bk, **launch,
    )  # fmt: skip
    bn = _pow2(n)
    pre = torch.empty((t, n), dtype=acc, device=streams.device)
    bt = max(1, min(_pow2(t), 4096 // (bn * bn)))  # the block's comb tiles: BLOCK_T x N x N values
    kern.hc_weights_kernel[(triton.cdiv(t, bt),)](
        mixes, scale, base, pre, post if has_post else pre, comb if iters else pre,  # unread when not asked
        t, n, float(hc_eps), float(post_mult), float(post_eps), int(iters),
        mixes.stride(0), scale.stride(0), base.stride(0), pre.stride(0), max(post.stride(0), 1),
        max(comb.stride(0), 1),
        HAS_POST=has_post, SINKHORN=iters > 0, ACC=_tl(acc), BLOCK_T=bt, BLOCK_N=bn, **launch,
    )  # fmt: skip
    kern.hc_apply_kernel[(t,)](
        streams, pre, x,
        n, d,
        *streams.stride(), pre.stride(0), x.stride(0),
        ACC=_tl(acc), RNE_BF16=rne_bf16(streams.dtype, tuning),
        BLOCK_N=bn, BLOCK_D=max(1, min(_pow2(d), block // bn)), **launch,
    )  # fmt: skip
    return x, post, comb


def hc_pre(
    streams, fn, scale, base, *, norm_eps, hc_eps, post_mult=2.0, post_eps=0.0, sinkhorn_iters=0, tuning: Tuning
):
    """``(x, post[, comb])``: the streams collapsed by pre, the expansion weights, DeepSeek-V4's comb."""
    check_hc_pre("hc_pre", streams, fn, scale, base, norm_eps, hc_eps, post_mult, post_eps, sinkhorn_iters)
    x, post, comb = _collapse(
        streams, fn, scale, base, norm_eps, hc_eps,
        post_mult=post_mult, post_eps=post_eps, iters=sinkhorn_iters, has_post=True, tuning=tuning,
    )  # fmt: skip
    return (x, post, comb) if sinkhorn_iters else (x, post)


def hc_head(streams, fn, scale, base, *, norm_eps, hc_eps, tuning: Tuning):
    """The final collapse ``sum_i pre_i * streams_i``."""
    check_hc_head("hc_head", streams, fn, scale, base, norm_eps, hc_eps)
    x, _, _ = _collapse(
        streams, fn, scale, base, norm_eps, hc_eps, post_mult=0.0, post_eps=0.0, iters=0, has_post=False, tuning=tuning
    )
    return x


def hc_post(y, streams, post, comb=None, *, tuning: Tuning):
    """``post_i * y + (comb^T @ streams)_i`` (``+ streams_i`` without comb) for every stream i."""
    t, n, d = check_hc_post("hc_post", y, streams, post, comb)
    out = torch.empty((t, n, d), dtype=streams.dtype, device=streams.device)
    if t == 0:
        return out
    meta, launch = Tuning.launch_options(tuning("elementwise"))
    block = int(meta.get("BLOCK", 1024))
    bn = _pow2(n)
    bd = max(1, min(_pow2(d), block // bn))
    c = comb if comb is not None else post  # never read without HAS_COMB
    c_strides = comb.stride() if comb is not None else (0, 0, 0)
    kern.hc_post_kernel[(t, triton.cdiv(d, bd))](
        y, streams, post, c, out,
        n, d,
        *y.stride(), *streams.stride(), *post.stride(), *c_strides, out.stride(0), out.stride(1),
        HAS_COMB=comb is not None, ACC=_tl(_acc(y, streams, post, comb)), RNE_BF16=rne_bf16(streams.dtype, tuning),
        BLOCK_N=bn, BLOCK_D=bd, **launch,
    )  # fmt: skip
    return out
