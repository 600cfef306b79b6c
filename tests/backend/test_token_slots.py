"""Per-token state slots (spec 1.11) in the backends: the torch backend against the reference on a verify
batch with mixed rows and acceptance counts (conv states bit for bit, the delta rule within float32
rounding), [N, 1] slots equal to [N] slots bit for bit, no step plan for per-token slots; ascend declines
them with its reason."""

from __future__ import annotations

import pytest
import torch

from hetero.errors import OpError
from hetero.registry import default_registry
from hetero.verify.inputs.recurrent_draw import Linear
from hetero.verify.inputs.recurrent_tokens import conv_tokens, gdr_tokens
from hetero.verify.plan import with_plan
from hetero_cpu_ref import recurrent as ref
from hetero_torch import recurrent as trec

LIN = Linear(2, 16, 4, 8)
SEQS = ((4, "init", 4), (2, "init", 1), (1, "init", 3), (3, "fresh", 1), (4, "hole", 3), (4, "pad", 2), (3, "nan", 1))
STATE = {"causal_conv1d": "conv_state", "gated_delta_rule": "ssm_state"}


def _draw(op, seqs, m, dtype, kda=False):
    make = conv_tokens if op == "causal_conv1d" else gdr_tokens
    lin = Linear(LIN.h, LIN.k, LIN.h if kda else LIN.hv, LIN.v, kda=kda)
    return make(lin, seqs, m)(torch.Generator().manual_seed(3), dtype)


def _run(fn, inputs):
    args = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    return fn(**args), args


@pytest.mark.parametrize(
    "op, dtype, kda",
    [
        ("causal_conv1d", torch.float32, False),
        ("causal_conv1d", torch.bfloat16, False),
        ("gated_delta_rule", torch.float32, False),
        ("gated_delta_rule", torch.bfloat16, True),
    ],
)
def test_verify_batch_matches_the_reference(op, dtype, kda):
    inputs = _draw(op, SEQS + ((0, "init", 2),), 4, dtype, kda)
    (want, wa), (got, ga) = _run(getattr(ref, op), inputs), _run(getattr(trec, op), inputs)
    name = STATE[op]
    if op == "causal_conv1d":
        assert torch.equal(got, want) and torch.equal(ga[name].nan_to_num(7.0), wa[name].nan_to_num(7.0))
    else:
        torch.testing.assert_close(got.float(), want.float(), atol=1e-5, rtol=1e-2 if dtype == torch.bfloat16 else 1e-5)
        torch.testing.assert_close(ga[name].nan_to_num(7.0), wa[name].nan_to_num(7.0), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("op", ["causal_conv1d", "gated_delta_rule"])
def test_one_column_equals_the_flat_form(op):
    inputs = _draw(op, ((1, "init", 1), (1, "fresh", 1), (1, "pad", 1), (1, "init", 1)), 1, torch.float32)
    flat = {**inputs, "state_slots": inputs["state_slots"][:, 0].clone(), "num_accepted_tokens": None}
    (a, sa), (b, sb) = _run(getattr(trec, op), inputs), _run(getattr(trec, op), flat)
    assert torch.equal(a, b) and torch.equal(sa[STATE[op]], sb[STATE[op]])


def test_per_token_slots_take_no_step_plan():
    ops = default_registry().load("torch", validate=True)
    inputs = _draw("gated_delta_rule", SEQS, 4, torch.float32)
    index = (inputs["query_start_loc"], inputs["state_slots"], inputs["has_initial_state"])
    with pytest.raises(OpError, match="plan_recurrent.*per-token slots \\[N, M\\] take no step plan"):
        ops.plan_recurrent(*index, num_tokens=int(index[0][-1]), num_slots=inputs["ssm_state"].shape[0])
    assert with_plan(ops, "gated_delta_rule", inputs) is None


def test_ascend_declines_per_token_slots_with_the_reason():
    from hetero_ascend import support

    for op in ("causal_conv1d", "gated_delta_rule"):
        assert "per-token" in support.reason(op, {"dtype": "bfloat16", "num_accepted_tokens": True}, True)
        assert "per-token" not in support.reason(op, {"dtype": "bfloat16"}, True)
