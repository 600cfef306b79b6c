"""Planted bugs of the hyper-connection ops (spec 1.7), in a compact, independent hc_pre, hc_post and
hc_head: token by token, the Sinkhorn projection as DeepSeek-V4 writes it. Their bug-free forms must
pass every quick case (``make_control``), which shows each planted bug is the only difference.
``broken_backends.BUGS`` includes ``BUGS`` from here.
"""

from __future__ import annotations

import torch
from _one_op import one_op_plugin

__all__ = ["BUGS", "mini_hc_pre", "mini_hc_post", "mini_hc_head", "make_control"]


def _acc(*tensors: torch.Tensor | None) -> torch.dtype:
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def _mixes(token: torch.Tensor, fn: torch.Tensor, norm_eps: float, bug: str | None) -> torch.Tensor:
    """One token's [N, D] streams against fn [M, N*D] (in fn's accumulation dtype)."""
    flat = token.flatten()
    mixes = fn @ flat
    if bug == "hc_pre_without_norm":
        return mixes
    return mixes / torch.sqrt(flat.square().mean() + norm_eps)


def _sinkhorn(logits: torch.Tensor, eps: float, iters: int, bug: str | None) -> torch.Tensor:
    c = logits.softmax(-1) + eps
    if bug == "hc_pre_sinkhorn_rows_last":  # each round normalizes columns, then rows
        for _ in range(iters):
            c = c / (c.sum(0, keepdim=True) + eps)
            c = c / (c.sum(1, keepdim=True) + eps)
        return c
    c = c / (c.sum(0, keepdim=True) + eps)
    for _ in range(iters - (2 if bug == "hc_pre_sinkhorn_one_short" else 1)):
        c = c / (c.sum(1, keepdim=True) + eps)
        c = c / (c.sum(0, keepdim=True) + eps)
    return c


def mini_hc_pre(bug: str | None):
    """hc_pre; ``bug`` names its one mistake (None: correct)."""

    def hc_pre(streams, fn, scale, base, *, norm_eps, hc_eps, post_mult=2.0, post_eps=0.0, sinkhorn_iters=0):
        acc = _acc(streams, fn)
        t, n, d = streams.shape
        x = torch.empty(t, d, dtype=streams.dtype)
        post = torch.empty(t, n, dtype=acc)
        comb = torch.empty(t, n, n, dtype=acc)
        f, s, b = fn.to(acc), scale.to(acc), base.to(acc)
        eps_post = 0.0 if bug == "hc_pre_post_without_eps" else post_eps
        for i in range(t):
            token = streams[i].to(acc)
            mixes = _mixes(token, f, norm_eps, bug)
            pre = torch.sigmoid(mixes[:n] * s[0] + b[:n]) + hc_eps
            post[i] = post_mult * torch.sigmoid(mixes[n : 2 * n] * s[1] + b[n : 2 * n]) + eps_post
            x[i] = (pre[:, None] * token).sum(0).to(streams.dtype)
            if sinkhorn_iters:
                logits = (mixes[2 * n :] * s[2] + b[2 * n :]).view(n, n)
                comb[i] = _sinkhorn(logits, hc_eps, sinkhorn_iters, bug)
        return (x, post, comb) if sinkhorn_iters else (x, post)

    return staticmethod(hc_pre)


def mini_hc_post(bug: str | None):
    """hc_post; ``bug`` names its one mistake (None: correct)."""

    def hc_post(y, streams, post, comb=None):
        acc = _acc(y, streams, post, comb)
        out = torch.empty(streams.shape, dtype=streams.dtype)
        for i in range(streams.shape[0]):
            s = streams[i].to(acc)
            if comb is not None:
                c = comb[i].to(acc)
                s = (c if bug == "hc_post_comb_untransposed" else c.T) @ s
            out[i] = (post[i].to(acc)[:, None] * y[i].to(acc)[None, :] + s).to(streams.dtype)
        return out

    return staticmethod(hc_post)


def mini_hc_head(bug: str | None):
    """hc_head; ``bug`` names its one mistake (None: correct)."""

    def hc_head(streams, fn, scale, base, *, norm_eps, hc_eps):
        acc = _acc(streams, fn)
        x = torch.empty(streams.shape[0], streams.shape[2], dtype=streams.dtype)
        eps = 0.0 if bug == "hc_head_without_hc_eps" else hc_eps
        for i in range(streams.shape[0]):
            token = streams[i].to(acc)
            pre = torch.sigmoid(_mixes(token, fn.to(acc), norm_eps, None) * scale.to(acc)[0] + base.to(acc)) + eps
            x[i] = (pre[:, None] * token).sum(0).to(streams.dtype)
        return x

    return staticmethod(hc_head)


_MINI = {"hc_pre": mini_hc_pre, "hc_post": mini_hc_post, "hc_head": mini_hc_head}
_BUG_OPS = {
    "hc_pre_without_norm": "hc_pre",  # mixes of the raw streams: the rsqrt(mean(x**2)) is dropped
    "hc_pre_sinkhorn_rows_last": "hc_pre",  # rows and columns normalized in the other order
    "hc_pre_sinkhorn_one_short": "hc_pre",  # one row/column round fewer than sinkhorn_iters asks
    "hc_pre_post_without_eps": "hc_pre",  # post_eps (HY4: hc_eps) not added to post
    "hc_post_comb_untransposed": "hc_post",  # comb @ streams instead of comb^T @ streams
    "hc_head_without_hc_eps": "hc_head",  # pre = sigmoid(...) without + hc_eps
}

#: bug name -> (the op it breaks, its implementation)
BUGS = {bug: (op, _MINI[op](bug)) for bug, op in _BUG_OPS.items()}


def make_control(op: str):
    """A plugin providing backend ``control_<op>``: the reference with the bug-free mini ``op``."""
    return one_op_plugin(f"control_{op}", op, _MINI[op](None))
