"""Per-token state slots (spec 1.11) of the reference recurrent ops against their definition by prefixes.

The state a per-token call leaves after row t of a sequence is, by the spec, the state an [N] call
leaves after that sequence's first t+1 rows from the same initial state (the one in column
``num_accepted_tokens - 1``); its outputs are the [N] call's over all its rows. ``prefix_oracle``
computes exactly that with [N] calls, one per row, each on a fresh copy of the states (so every
read sees the states as they were before the call), and is shared with the torch and Triton tests.
"""

from __future__ import annotations

import pytest
import torch

from hetero.errors import OpError
from hetero.verify.inputs.recurrent_draw import Linear
from hetero.verify.inputs.recurrent_tokens import conv_tokens, gdr_tokens
from hetero_cpu_ref import recurrent

LIN = Linear(2, 8, 4, 8)  # C = 64
SEQS = ((4, "init", 4), (2, "init", 1), (1, "init", 3), (3, "fresh", 1), (4, "hole", 3), (4, "pad", 2), (3, "nan", 1))
SEQS += ((0, "init", 2),)
STATE = {"causal_conv1d": "conv_state", "gated_delta_rule": "ssm_state"}
ROWS = {"causal_conv1d": ("x",), "gated_delta_rule": ("q", "k", "v", "g", "beta")}


def draw(op: str, seqs=SEQS, m: int = 4, dtype=torch.float64, seed: int = 0, **kw) -> dict:
    make = conv_tokens if op == "causal_conv1d" else gdr_tokens
    return make(LIN, seqs, m, **kw)(torch.Generator().manual_seed(seed), dtype)


def copy(inputs: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def prefix_oracle(op: str, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, states) a per-token call must produce, from [N] calls of the reference over prefixes."""
    fn, name = getattr(recurrent, op), STATE[op]
    states = inputs[name].clone()
    starts, rows = inputs["query_start_loc"].tolist(), inputs["state_slots"].tolist()
    initial = inputs["has_initial_state"].tolist()
    accepted = inputs["num_accepted_tokens"]
    cols = [a - 1 for a in accepted.tolist()] if accepted is not None else [0] * len(rows)
    out = None
    for n, row in enumerate(rows):
        a, e = starts[n], starts[n + 1]
        if row[0] < 0 or e == a:
            continue
        read = row[cols[n]] if initial[n] else row[0]
        for t in range(e - a):
            one = {k: v for k, v in copy(inputs).items() if k != "num_accepted_tokens"}
            for k in ROWS[op]:
                one[k] = inputs[k][a : a + t + 1]
            one["query_start_loc"] = torch.tensor([0, t + 1], dtype=torch.int32)
            one["state_slots"] = torch.tensor([read], dtype=torch.int32)
            one["has_initial_state"] = torch.tensor([initial[n]])
            y = fn(**one)
            if row[t] >= 0:
                states[row[t]] = one[name][read]
        if out is None:
            out = torch.zeros_like(fn(**copy(inputs)))
        out[a:e] = y
    return out, states


def assert_same(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor], exact: bool) -> None:
    for g, w in zip(got, want):
        if exact:
            assert torch.equal(g.nan_to_num(7.0), w.nan_to_num(7.0))
        else:
            torch.testing.assert_close(g.double().nan_to_num(7.0), w.double().nan_to_num(7.0), atol=2e-6, rtol=1e-5)


def run(fn, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    args = copy(inputs)
    out = fn(**args)
    return out, args[STATE[fn.__name__]]


@pytest.mark.parametrize("op", ["causal_conv1d", "gated_delta_rule"])
@pytest.mark.parametrize("accepted", [True, False])
def test_per_token_states_are_the_prefixes_states(op, accepted):
    """Mixed 0..M rows, every acceptance count, a -1 write, a skipped sequence over real slots, NaN
    slots, and a sequence writing the column it reads (its read comes first)."""
    seqs = SEQS if accepted else tuple((n, s, 1) for n, s, _ in SEQS if s != "hole")
    inputs = draw(op, seqs, accepted=accepted)
    want = prefix_oracle(op, inputs)
    assert_same(run(getattr(recurrent, op), inputs), want, exact=True)
    touched = {p for n, row in enumerate(inputs["state_slots"].tolist()) for p in row if seqs[n][1] != "pad"}
    pad = [row for n, row in enumerate(inputs["state_slots"].tolist()) if seqs[n][1] == "pad"]
    assert all(torch.equal(want[1][p], inputs[STATE[op]][p]) for row in pad for p in row[1:] if p not in touched)


@pytest.mark.parametrize("op", ["causal_conv1d", "gated_delta_rule"])
def test_one_column_equals_the_flat_form(op):
    """[N, 1] slots compute what [N] slots compute, bit for bit (a decode batch in per-token form)."""
    seqs = ((1, "init", 1), (1, "fresh", 1), (1, "pad", 1), (1, "init", 1))
    inputs = draw(op, seqs, 1, torch.float32)
    flat = copy(inputs)
    flat["state_slots"], flat["num_accepted_tokens"] = inputs["state_slots"][:, 0].clone(), None
    assert_same(run(getattr(recurrent, op), inputs), run(getattr(recurrent, op), flat), exact=True)


def test_per_token_index_errors_name_the_argument():
    inputs = draw("gated_delta_rule", ((3, "init", 2), (1, "fresh", 1)), 3, torch.float32)
    bad = copy(inputs)
    bad["num_accepted_tokens"] = torch.tensor([4, 1], dtype=torch.int32)
    with pytest.raises(OpError, match="num_accepted_tokens.*values in \\[1, 3\\]"):
        recurrent.gated_delta_rule(**bad)
    bad = copy(inputs)
    bad["state_slots"] = inputs["state_slots"][:, :2].clone()
    with pytest.raises(OpError, match="state_slots.*sequence 0 of 3 rows"):
        recurrent.gated_delta_rule(**bad)
    flat = copy(inputs)
    flat["state_slots"] = inputs["state_slots"][:, 0].clone()
    with pytest.raises(OpError, match="num_accepted_tokens.*None with state_slots \\[N\\]"):
        recurrent.gated_delta_rule(**flat)
