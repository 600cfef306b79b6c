"""Malformed calls of rejection_sample (spec 1.10).

Shapes, dtypes and options are always caught; the offsets and draft ids are index contents
(``index=True``: caught when validation is on). The valid call: 4 requests drafting 2, 0, 3 and 1
tokens over a vocabulary of 50, greedy and random mixed, with draft probabilities.
"""

from __future__ import annotations

import torch

from hetero_conformance.cases._malformed import Draw, Malformed, swap

__all__ = ["calls"]

KS, V, L = (2, 0, 3, 1), 50, 3
N = sum(KS)


def _call(d: Draw) -> dict:
    p = torch.softmax(d.randn(N, V, dtype=torch.float32), dim=-1)
    return {
        "draft_token_ids": d.ints(V, N),
        "cu_num_draft_tokens": torch.tensor([0, 2, 2, 5, 6], dtype=torch.int32, device=p.device),
        "target_probs": p,
        "bonus_token_ids": d.ints(V, len(KS)),
        "draft_probs": torch.softmax(d.randn(N, V, dtype=torch.float32), dim=-1),
        "max_spec_len": L,
        "is_greedy": torch.tensor([True, False, False, True], device=p.device),
        "seeds": d.ints(2**31, len(KS), dtype=torch.int64),
    }


def _cu(values: list[int]):
    return swap("cu_num_draft_tokens", lambda c, d: torch.tensor(values, dtype=torch.int32, device=c.device))


def _ids(make):
    return swap("draft_token_ids", lambda x, d: make(x))


def calls() -> list[Malformed]:
    """rejection_sample's malformed calls."""
    r = "rejection_sample"
    return [
        Malformed(r, "target_probs_bfloat16", _call, swap("target_probs", lambda p, d: p.bfloat16()), "target_probs"),
        Malformed(r, "target_probs_rows_not_n", _call, swap("target_probs", lambda p, d: p[:-1]), "target_probs"),
        Malformed(r, "draft_probs_other_vocab", _call, swap("draft_probs", lambda q, d: q[:, :-1]), "draft_probs"),
        Malformed(r, "draft_ids_float", _call, swap("draft_token_ids", lambda x, d: x.float()), "draft_token_ids"),
        Malformed(r, "bonus_wrong_batch", _call, swap("bonus_token_ids", lambda b, d: b[:-1]), "bonus_token_ids"),
        Malformed(r, "seeds_without_is_greedy", _call, swap("is_greedy", lambda g, d: None), "seeds"),
        Malformed(r, "seeds_int32", _call, swap("seeds", lambda s, d: s.int()), "seeds"),
        Malformed(r, "is_greedy_int", _call, swap("is_greedy", lambda g, d: g.int()), "is_greedy"),
        Malformed(r, "max_spec_len_negative", _call, swap("max_spec_len", lambda m, d: -1), "max_spec_len"),
        Malformed(r, "max_spec_len_float", _call, swap("max_spec_len", lambda m, d: 3.0), "max_spec_len"),
        Malformed(r, "cu_not_ending_at_n", _call, _cu([0, 2, 2, 5, 5]), "cu_num_draft_tokens", index=True),
        Malformed(r, "cu_decreasing", _call, _cu([0, 2, 1, 5, 6]), "cu_num_draft_tokens", index=True),
        Malformed(r, "k_over_max_spec_len", _call, _cu([0, 0, 0, 5, 6]), "cu_num_draft_tokens", index=True),
        Malformed(r, "draft_id_out_of_vocab", _call, _ids(lambda x: x + V), "draft_token_ids", index=True),
    ]
