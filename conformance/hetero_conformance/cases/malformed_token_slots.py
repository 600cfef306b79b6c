"""Malformed calls of the recurrent ops with per-token state slots (spec 1.11).

The valid call (both ops): three sequences of 2, 1 and 2 rows over per-token slots [3, 2]; the
first reads column 1 (num_accepted_tokens 2) and writes both, the second starts from zeros, the
third is skipped (column 0 is -1). Too many rows for M, num_accepted_tokens out of [1, M] and a
-1 where a sequence reads are index contents (``index=True``); num_accepted_tokens beside [N]
slots, of another dtype or length, and slots [N, 0] are always caught.
"""

from __future__ import annotations

import torch

from hetero_conformance.cases._malformed import Draw, Malformed, put, swap
from hetero_conformance.cases.malformed_recurrent import _conv, _gdr

__all__ = ["calls"]


def _tokens(base):
    def call(d: Draw) -> dict:
        return {
            **base(d),
            "state_slots": d.tensor([[2, 1], [0, 3], [-1, 1]]),
            "num_accepted_tokens": d.tensor([2, 1, 1]),
        }

    return call


def _calls(op: str, base) -> list[Malformed]:
    tok = _tokens(base)
    return [
        Malformed(
            op, "per_token_rows_past_m", tok, swap("state_slots", lambda s, d: s[:, :1].clone()), "state_slots", True
        ),
        Malformed(op, "num_accepted_tokens_zero", tok, put("num_accepted_tokens", 1, 0), "num_accepted_tokens", True),
        Malformed(op, "num_accepted_tokens_past_m", tok, put("num_accepted_tokens", 0, 3), "num_accepted_tokens", True),
        Malformed(op, "per_token_read_of_minus_one", tok, put("state_slots", (0, 1), -1), "state_slots", True),
        Malformed(op, "per_token_slot_past_slots", tok, put("state_slots", (1, 1), 4), "state_slots", True),
        Malformed(
            op,
            "num_accepted_tokens_with_1d_slots",
            base,
            swap("num_accepted_tokens", lambda a, d: d.tensor([1, 1, 1])),
            "num_accepted_tokens",
        ),
        Malformed(
            op,
            "num_accepted_tokens_float",
            tok,
            swap("num_accepted_tokens", lambda a, d: a.to(torch.float32)),
            "num_accepted_tokens",
        ),
        Malformed(
            op,
            "num_accepted_tokens_wrong_length",
            tok,
            swap("num_accepted_tokens", lambda a, d: a[:2].clone()),
            "num_accepted_tokens",
        ),
        Malformed(
            op, "per_token_slots_no_columns", tok, swap("state_slots", lambda s, d: s[:, :0].clone()), "state_slots"
        ),
    ]


def calls() -> list[Malformed]:
    """The per-token malformed calls of causal_conv1d and gated_delta_rule."""
    return _calls("causal_conv1d", _conv) + _calls("gated_delta_rule", _gdr)
