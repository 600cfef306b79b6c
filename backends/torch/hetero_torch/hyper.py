"""Hyper-connections (spec 1.7) from torch's batched operators: hc_pre, hc_post, hc_head.

Semantics: ``hetero.spec.hyper``. Each op computes in float32 (float64 when an input is float64) and
rounds x / out once to the streams' dtype; inputs are never modified. The mixes are one ``F.linear``
over the flattened streams, the collapse and hc_post's mixing one batched matrix product each.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hetero.spec.checks import check_hc_head, check_hc_post, check_hc_pre
from hetero_torch._layers_util import acc_dtype

__all__ = ["hc_pre", "hc_post", "hc_head"]


def _mixes(streams: torch.Tensor, fn: torch.Tensor, norm_eps: float, acc: torch.dtype) -> torch.Tensor:
    t, n, d = streams.shape
    flat = streams.reshape(t, n * d).to(acc)
    return F.linear(flat, fn.to(acc)) * torch.rsqrt(flat.square().mean(dim=-1, keepdim=True) + norm_eps)


def _collapse(streams: torch.Tensor, pre: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    # [T, 1, N] @ [T, N, D] -> [T, D]
    return torch.bmm(pre.unsqueeze(1), streams.to(acc)).squeeze(1).to(streams.dtype)


def hc_pre(streams, fn, scale, base, *, norm_eps, hc_eps, post_mult=2.0, post_eps=0.0, sinkhorn_iters=0):
    t, n, _ = check_hc_pre("hc_pre", streams, fn, scale, base, norm_eps, hc_eps, post_mult, post_eps, sinkhorn_iters)
    acc = acc_dtype(streams, fn, scale, base)
    s, b = scale.to(acc), base.to(acc)
    mixes = _mixes(streams, fn, float(norm_eps), acc)
    pre_logits, post_logits = mixes[:, :n], mixes[:, n : 2 * n]
    pre = torch.sigmoid(pre_logits * s[0] + b[:n]) + hc_eps
    post = torch.sigmoid(post_logits * s[1] + b[n : 2 * n]) * post_mult + post_eps
    x = _collapse(streams, pre, acc)
    if not sinkhorn_iters:
        return x, post
    comb = (mixes[:, 2 * n :] * s[2] + b[2 * n :]).view(t, n, n).softmax(dim=-1) + hc_eps
    comb = comb / (comb.sum(dim=1, keepdim=True) + hc_eps)
    for _ in range(sinkhorn_iters - 1):
        comb = comb / (comb.sum(dim=2, keepdim=True) + hc_eps)
        comb = comb / (comb.sum(dim=1, keepdim=True) + hc_eps)
    return x, post, comb


def hc_post(y, streams, post, comb=None):
    check_hc_post("hc_post", y, streams, post, comb)
    acc = acc_dtype(y, streams, post, comb)
    s = streams.to(acc)
    mixed = s if comb is None else torch.bmm(comb.to(acc).transpose(1, 2), s)  # comb^T @ streams
    return torch.addcmul(mixed, post.to(acc).unsqueeze(-1), y.to(acc).unsqueeze(1)).to(streams.dtype)


def hc_head(streams, fn, scale, base, *, norm_eps, hc_eps):
    check_hc_head("hc_head", streams, fn, scale, base, norm_eps, hc_eps)
    acc = acc_dtype(streams, fn, scale, base)
    pre = torch.sigmoid(_mixes(streams, fn, float(norm_eps), acc) * scale.to(acc)[0] + base.to(acc)) + hc_eps
    return _collapse(streams, pre, acc)
