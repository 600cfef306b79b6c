"""Inputs of the rejection_sample cases (spec 1.10).

``batch``: requests with the given draft counts over a vocabulary; target rows are peaked softmaxes
(logits of std 3) so argmaxes are unambiguous, and the draft rows are the target's logits plus
noise, as a draft model that mostly agrees. A fraction ``agree`` of the draft tokens is the
target's argmax (so greedy requests accept some), the rest drawn from the draft rows. ``greedy``:
"all" (``is_greedy`` None), "none" or "mixed". ``fixed``: the statistical cases' inputs, every
request with one draft token over one shared (p, q) pair of small rows, draft tokens drawn from q.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from hetero.verify.case import Builder
from hetero.verify.inputs.draw import randn

__all__ = ["batch", "fixed"]


def _cu(ks: Sequence[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(list(ks), dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32)


def _seeds(gen: torch.Generator, b: int) -> torch.Tensor:
    return torch.randint(-(2**63), 2**63 - 1, (b,), generator=gen, dtype=torch.int64)


def batch(
    ks: Sequence[int],
    vocab: int,
    *,
    greedy: str = "all",
    draft_free: bool = False,
    agree: float = 0.7,
    max_spec_len: int | None = None,
) -> Builder:
    """A batch with len(ks) requests, request b with ks[b] draft tokens."""

    def build(gen: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        b, n = len(ks), sum(ks)
        logits = randn(gen, (n, vocab), torch.float32, 3.0)
        p = torch.softmax(logits, dim=-1).to(dtype)
        q = torch.softmax(logits + randn(gen, (n, vocab), torch.float32, 1.5), dim=-1).to(dtype)
        drawn = torch.multinomial(q.float(), 1, generator=gen)[:, 0] if n else torch.zeros(0, dtype=torch.int64)
        pick = torch.rand(n, generator=gen) < agree
        x = torch.where(pick, p.argmax(dim=-1), drawn).to(torch.int32)
        args: dict[str, Any] = {
            "draft_token_ids": x,
            "cu_num_draft_tokens": _cu(ks),
            "target_probs": p,
            "bonus_token_ids": torch.randint(0, vocab, (b,), generator=gen, dtype=torch.int32),
            "draft_probs": None if draft_free else q,
            "max_spec_len": max(ks, default=0) if max_spec_len is None else max_spec_len,
        }
        if greedy != "all":
            flags = torch.rand(b, generator=gen) < 0.5 if greedy == "mixed" else torch.zeros(b, dtype=torch.bool)
            if greedy == "mixed" and b >= 2:
                flags[0], flags[1] = True, False  # both kinds whatever the draw
            args["is_greedy"], args["seeds"] = flags, _seeds(gen, b)
        return args

    return build


def fixed(p: Sequence[float], q: Sequence[float] | None, requests: int) -> Builder:
    """``requests`` one-draft requests over the rows p (target) and q (draft; None: draft-free)."""

    def build(gen: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        pt = torch.tensor(p, dtype=torch.float32)
        qt = None if q is None else torch.tensor(q, dtype=torch.float32)
        draw_from = qt if qt is not None else torch.full_like(pt, 1.0 / len(p))
        x = torch.multinomial(draw_from, requests, replacement=True, generator=gen).to(torch.int32)
        return {
            "draft_token_ids": x,
            "cu_num_draft_tokens": torch.arange(requests + 1, dtype=torch.int32),
            "target_probs": pt.expand(requests, -1).to(dtype).contiguous(),
            "bonus_token_ids": torch.randint(0, len(p), (requests,), generator=gen, dtype=torch.int32),
            "draft_probs": None if qt is None else qt.expand(requests, -1).to(dtype).contiguous(),
            "max_spec_len": 1,
            "is_greedy": torch.zeros(requests, dtype=torch.bool),
            "seeds": _seeds(gen, requests),
        }

    return build
