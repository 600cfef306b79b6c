"""Reference hyper-connections (spec 1.7): hc_pre, hc_post, hc_head, written as the spec states them.

Semantics: ``hetero.spec.hyper``. float32 arithmetic, float64 when an input is float64 (the oracle's
run); x and out are rounded once to the streams' dtype.
"""

from __future__ import annotations

import torch

from hetero.spec.checks import check_hc_head, check_hc_post, check_hc_pre
from hetero_cpu_ref._util import acc_dtype, up

__all__ = ["hc_pre", "hc_post", "hc_head"]


def _mixes(streams: torch.Tensor, fn: torch.Tensor, norm_eps: float, acc: torch.dtype) -> torch.Tensor:
    """(flat @ fn^T) * rsqrt(mean(flat**2) + norm_eps) in ``acc``: [T, M]."""
    flat = up(streams, acc).reshape(streams.shape[0], streams.shape[1] * streams.shape[2])
    r = torch.rsqrt(flat.square().mean(dim=-1, keepdim=True) + norm_eps)
    return (flat @ up(fn, acc).T) * r


def _collapse(streams: torch.Tensor, pre: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """sum_i pre[:, i] * streams[:, i, :] in ``acc``, rounded once to the streams' dtype."""
    return (pre.unsqueeze(-1) * up(streams, acc)).sum(dim=1).to(streams.dtype)


def _sinkhorn(logits: torch.Tensor, hc_eps: float, iters: int) -> torch.Tensor:
    """DeepSeek-V4's comb: softmax over rows plus eps, columns normalized, then ``iters - 1`` row/column rounds."""
    c = torch.softmax(logits, dim=-1) + hc_eps
    c = c / (c.sum(dim=-2, keepdim=True) + hc_eps)
    for _ in range(iters - 1):
        c = c / (c.sum(dim=-1, keepdim=True) + hc_eps)
        c = c / (c.sum(dim=-2, keepdim=True) + hc_eps)
    return c


def hc_pre(
    streams: torch.Tensor,
    fn: torch.Tensor,
    scale: torch.Tensor,
    base: torch.Tensor,
    *,
    norm_eps: float,
    hc_eps: float,
    post_mult: float = 2.0,
    post_eps: float = 0.0,
    sinkhorn_iters: int = 0,
) -> tuple[torch.Tensor, ...]:
    tokens, n, _ = check_hc_pre(
        "hc_pre", streams, fn, scale, base, norm_eps, hc_eps, post_mult, post_eps, sinkhorn_iters
    )
    acc = acc_dtype(streams, fn, scale, base)
    mixes = _mixes(streams, fn, float(norm_eps), acc)
    s, b = up(scale, acc), up(base, acc)
    pre = torch.sigmoid(mixes[:, :n] * s[0] + b[:n]) + hc_eps
    post = post_mult * torch.sigmoid(mixes[:, n : 2 * n] * s[1] + b[n : 2 * n]) + post_eps
    x = _collapse(streams, pre, acc)
    if not sinkhorn_iters:
        return x, post
    logits = mixes[:, 2 * n :].reshape(tokens, n, n) * s[2] + b[2 * n :].reshape(n, n)
    return x, post, _sinkhorn(logits, float(hc_eps), sinkhorn_iters)


def hc_post(
    y: torch.Tensor,
    streams: torch.Tensor,
    post: torch.Tensor,
    comb: torch.Tensor | None = None,
) -> torch.Tensor:
    check_hc_post("hc_post", y, streams, post, comb)
    acc = acc_dtype(y, streams, post, comb)
    s = up(streams, acc)
    residual = s if comb is None else torch.einsum("tji,tjd->tid", up(comb, acc), s)
    return (up(post, acc).unsqueeze(-1) * up(y, acc).unsqueeze(1) + residual).to(streams.dtype)


def hc_head(
    streams: torch.Tensor,
    fn: torch.Tensor,
    scale: torch.Tensor,
    base: torch.Tensor,
    *,
    norm_eps: float,
    hc_eps: float,
) -> torch.Tensor:
    check_hc_head("hc_head", streams, fn, scale, base, norm_eps, hc_eps)
    acc = acc_dtype(streams, fn, scale, base)
    mixes = _mixes(streams, fn, float(norm_eps), acc)
    pre = torch.sigmoid(mixes * up(scale, acc)[0] + up(base, acc)) + hc_eps
    return _collapse(streams, pre, acc)
