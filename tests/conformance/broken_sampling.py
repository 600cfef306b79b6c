"""Planted bugs of rejection_sample (spec 1.10), in a compact, independent implementation: one draft
position at a time, the residual's inverse CDF by ``searchsorted``. Its bug-free form must pass every
quick case (``make_control``), which shows each planted bug is the only difference.
``broken_backends.BUGS`` includes ``BUGS`` from here.
"""

from __future__ import annotations

import torch
from _one_op import one_op_plugin

__all__ = ["BUGS", "mini_rejection_sample", "make_control"]

_M = 0xFFFFFFFF


def _key(seed: int, j: int, s: int) -> int:
    h = (seed >> 32) & _M
    for word in (None, seed & _M, j, s):
        h = h if word is None else h ^ word
        h ^= h >> 16
        h = (h * 0x7FEB352D) & _M
        h ^= h >> 15
        h = (h * 0x846CA68B) & _M
        h ^= h >> 16
    return h


def _decide(p, q, x, seed, j, bug):
    """(accepted, the token emitted) at one random draft position."""
    qx = 1.0 if q is None else float(q[x])
    u = ((_key(seed, j, 0) >> 8) + 1) / 2**24
    if qx > 0 and float(p[x]) >= u * qx:
        return True, x
    if bug == "rejection_sample_recovered_from_target":
        res = p.clone()
    elif q is None:
        res = p.clone()
        res[x] = 0
    else:
        res = (p - q).clamp(min=0)
    w = (res.double() * 2**40).floor().long().cumsum(0)
    if int(w[-1]) == 0:
        return False, int(torch.argmax(p))
    r = (((_key(seed, j, 1) >> 1) << 32) | _key(seed, j, 2)) % int(w[-1])
    return False, int(torch.searchsorted(w, torch.tensor([r]), right=True))


def mini_rejection_sample(bug: str | None):
    """rejection_sample; ``bug`` names its one mistake (None: correct)."""

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
        cu = cu_num_draft_tokens.tolist()
        p_all = target_probs.float()
        out = torch.full((len(cu) - 1, max_spec_len + 1), -1, dtype=torch.int32)
        for b in range(len(cu) - 1):
            greedy = is_greedy is None or bool(is_greedy[b])
            row = []
            for j, t in enumerate(range(cu[b], cu[b + 1])):
                p, x = p_all[t], int(draft_token_ids[t])
                if greedy:
                    ok, tok = int(torch.argmax(p)) == x, int(torch.argmax(p))
                else:
                    q = None if draft_probs is None else draft_probs[t].float()
                    ok, tok = _decide(p, q, x, int(seeds[b]), j, bug)
                row.append(tok)
                if not ok:
                    if bug == "rejection_sample_padding_off_by_one" and t + 1 < cu[b + 1]:
                        row.append(int(draft_token_ids[t + 1]))  # the padding starts one late
                    break
            else:
                if not (bug == "rejection_sample_greedy_no_bonus" and greedy and cu[b + 1] > cu[b]):
                    row.append(int(bonus_token_ids[b]))
            out[b, : len(row)] = torch.tensor(row, dtype=torch.int32)
        return out

    return staticmethod(rejection_sample)


_BUGS = (
    "rejection_sample_recovered_from_target",  # the recovered token drawn from p_target, not the residual
    "rejection_sample_greedy_no_bonus",  # a greedy request that accepts every draft drops its bonus token
    "rejection_sample_padding_off_by_one",  # after a rejection, the next draft token where -1 belongs
)

#: bug name -> (the op it breaks, its implementation)
BUGS = {bug: ("rejection_sample", mini_rejection_sample(bug)) for bug in _BUGS}


def make_control():
    """A plugin providing backend ``control_rejection_sample``: the reference with the bug-free mini op."""
    return one_op_plugin("control_rejection_sample", "rejection_sample", mini_rejection_sample(None))
