"""Rejection sampling (spec 1.10) from torch's batched operators: every draft position at once, then the walk.

Semantics and the random draws: ``hetero.spec.sampling``. The hash runs on int64 tensors holding
32-bit words; its products are taken on 16-bit halves so no int64 product overflows. Each draft
position's verdict and rejection token are computed independently; the accepted prefix of each
request is then a cumulative product over its padded row.
"""

from __future__ import annotations

import torch

from hetero.kernels.draft_walk import draft_positions, emitted
from hetero.spec.checks import check_rejection_sample
from hetero.spec.sampling import RECOVERED_SCALE

__all__ = ["rejection_sample"]

_M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """x * c mod 2**32 for x < 2**32, without an int64 overflow."""
    return ((x & 0xFFFF) * c + ((((x >> 16) * c) & 0xFFFF) << 16)) & _M32


def _mix(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _keys(seed: torch.Tensor, j: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """key(seed, j, s) for the streams s = 0, 1, 2."""
    base = _mix(_mix(_mix((seed >> 32) & _M32) ^ (seed & _M32)) ^ j)
    return tuple(_mix(base ^ s) for s in range(3))


def _recovered(p: torch.Tensor, q: torch.Tensor | None, x: torch.Tensor, r63: torch.Tensor, top: torch.Tensor):
    if q is None:
        residual = p.scatter(1, x[:, None], 0.0)
    else:
        residual = torch.clamp(p - q, min=0)
    w = torch.floor(residual.to(torch.float64) * RECOVERED_SCALE).to(torch.int64)
    total = w.sum(dim=1)
    target = r63 % total.clamp(min=1)
    first = (torch.cumsum(w, dim=1) > target[:, None]).to(torch.int8).argmax(dim=1)
    return torch.where(total > 0, first, top)


def rejection_sample(
    draft_token_ids,
    cu_num_draft_tokens,
    target_probs,
    bonus_token_ids,
    draft_probs=None,
    *,
    max_spec_len,
    is_greedy=None,
    seeds=None,
):
    batch, n, _ = check_rejection_sample(
        draft_token_ids,
        cu_num_draft_tokens,
        target_probs,
        bonus_token_ids,
        draft_probs,
        max_spec_len=max_spec_len,
        is_greedy=is_greedy,
        seeds=seeds,
    )
    device, width = target_probs.device, max_spec_len + 1
    if batch == 0:
        return torch.empty((0, width), dtype=torch.int32, device=device)
    counts, req, j = draft_positions(cu_num_draft_tokens, n, batch, max_spec_len)
    x = draft_token_ids.to(torch.int64).clamp(0, target_probs.shape[1] - 1)
    p = target_probs.to(torch.float32)
    top = torch.argmax(p, dim=1) if n else x
    accepted = top == x
    token = top
    if is_greedy is not None and n:
        q = None if draft_probs is None else draft_probs.to(torch.float32)
        k0, k1, k2 = _keys(seeds[req], j)
        u = ((k0 >> 8) + 1).to(torch.float64) / 2**24
        px = p.gather(1, x[:, None])[:, 0].to(torch.float64)
        qx = torch.ones_like(px) if q is None else q.gather(1, x[:, None])[:, 0].to(torch.float64)
        random_ok = (qx > 0) & (px >= u * qx)
        recovered = _recovered(p, q, x, ((k1 >> 1) << 32) | k2, top)
        greedy = is_greedy[req]
        accepted = torch.where(greedy, accepted, random_ok)
        token = torch.where(greedy, top, torch.where(random_ok, x, recovered))
    return emitted(accepted, token, x, bonus_token_ids, counts, req, j, width)
