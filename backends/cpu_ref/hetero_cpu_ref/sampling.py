"""Reference rejection sampling (spec 1.10): request by request, draft position by position, as the spec states it.

Semantics and the random draws: ``hetero.spec.sampling``. The hash runs on Python ints; the
probabilities are read as float32 (the oracle's float64 copies hold float32 values).
"""

from __future__ import annotations

import torch

from hetero.spec.checks import check_rejection_sample, check_rejection_sample_indices
from hetero.spec.sampling import RECOVERED_SCALE

__all__ = ["rejection_sample"]

_M32 = 0xFFFFFFFF


def _mix(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def _key(seed: int, j: int, stream: int) -> int:
    lo, hi = seed & _M32, (seed >> 32) & _M32
    return _mix(_mix(_mix(_mix(hi) ^ lo) ^ j) ^ stream)


def _uniform(seed: int, j: int) -> float:
    """u(j), in (0, 1]."""
    return ((_key(seed, j, 0) >> 8) + 1) / 2**24


def _r63(seed: int, j: int) -> int:
    return ((_key(seed, j, 1) >> 1) << 32) | _key(seed, j, 2)


def _argmax(p: torch.Tensor) -> int:
    """The lowest index among the maxima."""
    return int((p == p.max()).nonzero()[0, 0])


def _recovered(p: torch.Tensor, q: torch.Tensor | None, x: int, seed: int, j: int) -> int:
    """The recovered token: inverse CDF over the integer weights of the residual."""
    if q is None:
        residual = p.clone()
        residual[x] = 0
    else:
        residual = torch.clamp(p - q, min=0)  # float32 subtraction
    w = torch.floor(residual.to(torch.float64) * RECOVERED_SCALE).to(torch.int64)
    total = int(w.sum())
    if total == 0:
        return _argmax(p)
    target = _r63(seed, j) % total
    return int((torch.cumsum(w, 0) > target).nonzero()[0, 0])


def _accepted(p: torch.Tensor, q: torch.Tensor | None, x: int, seed: int, j: int) -> bool:
    qx = 1.0 if q is None else float(q[x])
    # p(x)/q(x) >= u as p(x) >= u * q(x): both factors have 24 significant bits, so the float64 product is exact
    return qx > 0 and float(p[x]) >= _uniform(seed, j) * qx


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
    batch, _, vocab = check_rejection_sample(
        draft_token_ids,
        cu_num_draft_tokens,
        target_probs,
        bonus_token_ids,
        draft_probs,
        max_spec_len=max_spec_len,
        is_greedy=is_greedy,
        seeds=seeds,
    )
    cu = check_rejection_sample_indices(draft_token_ids, cu_num_draft_tokens, vocab, max_spec_len)
    probs = target_probs.to("cpu", torch.float32)
    dprobs = None if draft_probs is None else draft_probs.to("cpu", torch.float32)
    drafts = draft_token_ids.tolist()
    bonus = bonus_token_ids.tolist()
    greedy = [True] * batch if is_greedy is None else is_greedy.tolist()
    seed_of = [0] * batch if seeds is None else seeds.tolist()
    out = torch.full((batch, max_spec_len + 1), -1, dtype=torch.int32)
    for b in range(batch):
        start, k = cu[b], cu[b + 1] - cu[b]
        emitted = []
        for j in range(k):
            p = probs[start + j]
            q = None if dprobs is None else dprobs[start + j]
            x = drafts[start + j]
            if greedy[b]:
                token = _argmax(p)
                ok = token == x
            else:
                ok = _accepted(p, q, x, seed_of[b], j)
                token = x if ok else _recovered(p, q, x, seed_of[b], j)
            emitted.append(token)
            if not ok:
                break
        else:
            emitted.append(bonus[b])
        out[b, : len(emitted)] = torch.tensor(emitted, dtype=torch.int32)
    return out.to(target_probs.device)
