"""The Triton recurrent kernels with per-token state slots (spec 1.11), interpreted, against the reference:
a verify batch with mixed rows and acceptance counts (a sequence writing the column it reads, a -1 write,
a skipped sequence over real slots, NaN slots), conv widths 2 and 4, KDA; [N, 1] slots equal to [N] bit for
bit; validation naming the argument; and malformed per-token indices never reading or writing outside."""

from __future__ import annotations

import math

import pytest
import torch

from hetero.errors import OpError
from hetero.verify.inputs.recurrent_draw import Linear
from hetero.verify.inputs.recurrent_tokens import conv_tokens, gdr_tokens
from hetero_cpu_ref import recurrent as ref

SEQS = ((4, "init", 1), (2, "init", 2), (1, "init", 3), (3, "fresh", 1), (4, "hole", 4), (3, "pad", 2), (2, "nan", 1))
STATE = {"causal_conv1d": "conv_state", "gated_delta_rule": "ssm_state"}


def _draw(op, seqs, m, dtype=torch.float32, lin=Linear(2, 16, 4, 16), **kw):
    make = conv_tokens if op == "causal_conv1d" else gdr_tokens
    return make(lin, seqs, m, **kw)(torch.Generator().manual_seed(5), dtype)


def _run(fn, inputs):
    args = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    return fn(**args), args


@pytest.mark.parametrize("width", [2, 4])
def test_conv_matches_the_reference_bit_for_bit(triton_backend, width):
    inputs = _draw("causal_conv1d", SEQS, 4, torch.bfloat16, width=width)
    (want, wa), (got, ga) = _run(ref.causal_conv1d, inputs), _run(triton_backend.causal_conv1d, inputs)
    assert torch.equal(got, want) and torch.equal(ga["conv_state"].nan_to_num(7.0), wa["conv_state"].nan_to_num(7.0))


@pytest.mark.parametrize("kda", [False, True])
def test_delta_matches_the_reference(triton_backend, kda):
    lin = Linear(2, 16, 2 if kda else 4, 16, kda=kda)
    seqs = [(n, s, 1) for n, s, _ in SEQS if s != "hole"] if kda else SEQS  # KDA: num_accepted_tokens None
    inputs = _draw("gated_delta_rule", seqs, 4, lin=lin, accepted=not kda)
    (want, wa), (got, ga) = _run(ref.gated_delta_rule, inputs), _run(triton_backend.gated_delta_rule, inputs)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ga["ssm_state"].nan_to_num(7.0), wa["ssm_state"].nan_to_num(7.0), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("op", ["causal_conv1d", "gated_delta_rule"])
def test_one_column_equals_the_flat_form(triton_backend, op):
    inputs = _draw(op, ((1, "init", 1), (1, "fresh", 1), (1, "pad", 1), (1, "init", 1)), 1)
    flat = {**inputs, "state_slots": inputs["state_slots"][:, 0].clone(), "num_accepted_tokens": None}
    (a, sa), (b, sb) = _run(getattr(triton_backend, op), inputs), _run(getattr(triton_backend, op), flat)
    assert torch.equal(a, b) and torch.equal(sa[STATE[op]], sb[STATE[op]])


def test_validation_names_the_argument(validated_ops):
    inputs = _draw("gated_delta_rule", ((3, "init", 2), (1, "fresh", 1)), 3)
    with pytest.raises(OpError, match="gated_delta_rule.*num_accepted_tokens"):
        validated_ops.gated_delta_rule(**{**inputs, "num_accepted_tokens": torch.tensor([0, 1], dtype=torch.int32)})
    with pytest.raises(OpError, match="causal_conv1d.*num_accepted_tokens.*None with state_slots \\[N\\]"):
        conv = _draw("causal_conv1d", ((3, "init", 2),), 3)
        validated_ops.causal_conv1d(**{**conv, "state_slots": conv["state_slots"][:, 0].clone()})


def _guarded(shape, fill, guard):
    n = math.prod(shape)
    buf = torch.full((n + 128,), guard)
    buf[64 : 64 + n] = fill.reshape(-1)
    return buf, buf[64 : 64 + n].view(shape)


def test_malformed_per_token_indices_stay_inside(triton_backend):
    """Validation off: rows past M, slots past S or below -1, num_accepted_tokens 0 and past M. States
    sit between sentinel guards: no read of a guard (states stay finite), no write to one."""
    qsl = torch.tensor([0, 5, 6, 8], dtype=torch.int32)
    slots = torch.tensor([[0, 1], [10**6, 2], [-7, 3]], dtype=torch.int32)
    init, accepted = torch.tensor([True, True, True]), torch.tensor([0, 9, 2], dtype=torch.int32)
    idx = {"query_start_loc": qsl, "state_slots": slots, "has_initial_state": init, "num_accepted_tokens": accepted}
    x = _guarded((8, 8), torch.randn(8, 8), float("nan"))[1]
    cbuf, conv = _guarded((4, 3, 8), torch.randn(4, 3, 8), 7.0)
    triton_backend.causal_conv1d(x, torch.randn(8, 4), None, conv, **idx)
    assert (cbuf[:64] == 7).all() and (cbuf[-64:] == 7).all() and conv.isfinite().all()
    q, k, v = (torch.randn(8, 2, 16), torch.randn(8, 2, 16), torch.randn(8, 4, 16))
    g, beta = -torch.rand(8, 4), torch.rand(8, 4)
    sbuf, state = _guarded((4, 4, 16, 16), torch.randn(4, 4, 16, 16), 7.0)
    triton_backend.gated_delta_rule(q, k, v, g, beta, state, **idx, scale=0.25)
    assert (sbuf[:64] == 7).all() and (sbuf[-64:] == 7).all() and state.isfinite().all()
