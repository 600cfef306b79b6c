"""Inputs of the recurrent cases with per-token state slots (spec 1.11): speculative decoding's verify
calls, each sequence 1 + k rows with its states kept after every row in slots [N, M].

A batch names every column of every sequence a slot of its own (a random permutation of more
slots than it names, all holding random values), so a write to a wrong column, a write past a
sequence's rows, or a read of the wrong column changes a compared state. The initial state is
read from column ``num_accepted_tokens - 1``; each sequence's other columns hold garbage.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from hetero.verify.inputs.draw import perm, randn
from hetero.verify.inputs.recurrent import conv_static, gdr_static
from hetero.verify.inputs.recurrent_draw import Linear, gates, nan_fill, qkv

__all__ = ["TokenSeq", "token_batch", "conv_tokens", "gdr_tokens", "token_static"]

#: One sequence of a per-token batch: (rows L <= M, state, accepted a in [1, M]), state one of
#: "init" (reads column a-1), "fresh" (no initial state), "nan" (no initial state, its slots NaN),
#: "pad" (column 0 is -1: skipped, though its other columns name real slots, which stay as they are),
#: or "hole" ("init" with a -1 entry at its row 1: that write is skipped).
TokenSeq = tuple[int, str, int]


def token_batch(
    gen: torch.Generator, seqs: Sequence[TokenSeq], m: int, spare: int = 1, accepted: bool = True
) -> tuple[dict[str, torch.Tensor | None], int, list[int]]:
    """(query_start_loc, state_slots [N, M], has_initial_state, num_accepted_tokens), the slot count S
    and the NaN slots. ``accepted`` False: num_accepted_tokens None (every sequence reads column 0)."""
    num_slots = len(seqs) * m + spare
    order = perm(gen, num_slots).tolist()
    rows, initial, starts, nan, taken = [], [], [0], [], []
    for n, (length, state, a) in enumerate(seqs):
        assert length <= m and 1 <= a <= m and (accepted or a == 1), (length, m, a)
        row = order[n * m : (n + 1) * m]
        if state == "pad":
            row[0] = -1
        if state == "hole":
            assert length > 1 and a != 2, "the hole is row 1's write, not the column read"
            row[1] = -1
        if state == "nan":
            nan += row
        rows.append(row)
        initial.append(state in ("init", "hole") or (state == "pad" and length % 2 == 1))
        starts.append(starts[-1] + length)
        taken.append(a)
    index = {
        "query_start_loc": torch.tensor(starts, dtype=torch.int32),
        "state_slots": torch.tensor(rows, dtype=torch.int32).reshape(len(seqs), m),
        "has_initial_state": torch.tensor(initial, dtype=torch.bool),
        "num_accepted_tokens": torch.tensor(taken, dtype=torch.int32) if accepted else None,
    }
    return index, num_slots, nan


def conv_tokens(lin: Linear, seqs: Sequence[TokenSeq], m: int, *, accepted: bool = True, width: int | None = None):
    """causal_conv1d over [T, C] with per-token slots [N, M] (``width``: W other than the model's)."""
    w, c = width or lin.width, lin.channels

    def build(gen: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        index, num_slots, nan = token_batch(gen, seqs, m, accepted=accepted)
        t = int(index["query_start_loc"][-1])  # type: ignore[index]
        return {
            "x": randn(gen, (t, c), dtype),
            "weight": randn(gen, (c, w), dtype, 0.5),
            "bias": None,
            "conv_state": nan_fill(randn(gen, (num_slots, w - 1, c), dtype), nan),
            **index,
            "activation": "silu",
        }

    return build


def gdr_tokens(lin: Linear, seqs: Sequence[TokenSeq], m: int, *, accepted: bool = True, beta_f32: bool = False):
    """gated_delta_rule with per-token slots [N, M]; q, k, v strided views of the conv output."""
    spare = 1 if lin.hv * lin.k * lin.v <= 1 << 17 else 0

    def build(gen: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        index, num_slots, nan = token_batch(gen, seqs, m, spare, accepted)
        t = int(index["query_start_loc"][-1])  # type: ignore[index]
        q, k, v = qkv(gen, lin, t, dtype, True, normalized=False)
        state = nan_fill(randn(gen, (num_slots, lin.hv, lin.k, lin.v), torch.float32, 0.1), nan)
        return {
            "q": q,
            "k": k,
            "v": v,
            **gates(gen, lin, t, torch.float32 if beta_f32 else dtype),
            "ssm_state": state,
            **index,
            "scale": lin.k**-0.5,
            "use_qk_l2norm": True,
        }

    return build


def token_static(op: str, dt: str, lin: Linear, width: int | None = None) -> dict[str, Any]:
    """The static configuration of a per-token case: the op's own, and ``num_accepted_tokens=True``."""
    base = conv_static(dt, lin, width) if op == "causal_conv1d" else gdr_static(dt, lin)
    return {**base, "num_accepted_tokens": True}
