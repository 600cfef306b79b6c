"""The step plan (spec 1.6): ``Ops.plan_attention`` / ``plan_recurrent`` check the metadata once per
step, the torch backend's hooks prepare it once, and the planned path of every op that takes a plan
passes conformance; a plan serves only the tensors it was made from, a broken hook is contained."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import hetero
from hetero.cli import main
from hetero.errors import OpError
from hetero.spec import validate
from hetero.spec.types import AttentionMeta

pytest.importorskip("hetero_torch")

PLANNED = "paged_attention,mla_attention,indexer_topk,causal_conv1d,gated_delta_rule"


def test_planned_ops_pass_conformance_through_the_torch_hooks():
    """Every case of the planned ops runs twice, the second time with the hook's plan (the runner's
    ``_planned``); a wrong plan fails the case with "with the step plan: ..."."""
    assert main(["conformance", "torch", "--quick", "--ops", PLANNED]) == 0


def _meta_and_inputs(gen):
    meta = AttentionMeta.build([5, 1, 1], [9, 30, 4], [[3, 1, 0], [5, 2, 6], [4, 7, 8]])
    query = torch.randn(7, 8, 64, generator=gen)
    cache = torch.randn(2, 9, 16, 2, 64, generator=gen)
    return meta, query, cache[0], cache[1]


def test_a_checked_plan_is_checked_once_per_step_not_per_layer(monkeypatch):
    ops = hetero.load("torch", validate=True)
    meta, q, k, v = _meta_and_inputs(torch.Generator().manual_seed(0))
    calls = []
    real = validate.check_meta
    monkeypatch.setattr(validate, "check_meta", lambda *a: calls.append(a[0]) or real(*a))
    want = ops.paged_attention(q, k, v, meta, scale=0.125)
    assert calls == ["paged_attention"]  # unplanned: the registry checks the call
    planned = ops.plan_attention(meta, num_tokens=7, num_blocks=9, block_size=16)
    assert planned.plan.checked and planned.plan.backend == "torch" and planned.plan.data is not None
    calls.clear()
    for _ in range(3):  # three layers
        torch.testing.assert_close(ops.paged_attention(q, k, v, planned, scale=0.125), want, rtol=0, atol=0)
    assert calls == []


def test_a_plan_serves_only_the_tensors_and_sizes_it_was_made_for():
    ops = hetero.load("torch", validate=True)
    meta, q, k, v = _meta_and_inputs(torch.Generator().manual_seed(1))
    planned = ops.plan_attention(meta, num_tokens=7, num_blocks=9, block_size=16)
    assert planned.planned(7, 9, 16) is planned.plan
    assert planned.planned(7, 9, 8) is None and planned.planned(6, 9, 16) is None
    # the plan rides along a replaced tensor, which it was not made from: the op checks and computes anew
    bad = dataclasses.replace(planned, block_table=torch.full_like(meta.block_table, 40))
    assert bad.planned(7, 9, 16) is None
    with pytest.raises(OpError, match=r"paged_attention.*meta\.block_table.*\[0, 9\)"):
        ops.paged_attention(q, k, v, bad, scale=0.125)
    longer = dataclasses.replace(planned, max_seq_len=31)
    assert longer.planned(7, 9, 16) is None


def test_planning_checks_the_values_when_validation_is_on():
    meta = AttentionMeta.build([2, 1], [5, 3], [[0, 11], [2, 3]])  # block 11 of 9
    ops = hetero.load("cpu_ref", validate=True)  # no hook: Ops itself checks
    with pytest.raises(OpError, match=r"plan_attention.*meta\.block_table.*\[0, 9\)"):
        ops.plan_attention(meta, num_tokens=3, num_blocks=9, block_size=4)
    slots = torch.tensor([0, 7], dtype=torch.int32)
    with pytest.raises(OpError, match=r"plan_recurrent.*state_slots"):
        ops.plan_recurrent(meta.query_start_loc, slots, torch.tensor([True, False]), num_tokens=3, num_slots=4)
    plan = ops.plan_recurrent(meta.query_start_loc, slots, torch.tensor([True, False]), num_tokens=3, num_slots=8)
    assert plan.checked and plan.data is None and plan.sizes == (3, 8)


def test_the_recurrent_plan_gives_the_same_state_and_output():
    ops, gen = hetero.load("torch"), torch.Generator().manual_seed(2)
    qsl = torch.tensor([0, 6, 7, 7, 19], dtype=torch.int32)
    slots, initial = torch.tensor([2, 0, 3, -1], dtype=torch.int32), torch.tensor([False, True, True, True])
    x, w = torch.randn(19, 48, generator=gen), torch.randn(48, 4, generator=gen)
    state = torch.randn(5, 3, 48, generator=gen)
    plan = ops.plan_recurrent(qsl, slots, initial, num_tokens=19, num_slots=5)
    assert plan.data is not None
    s1, s2 = state.clone(), state.clone()
    out = ops.causal_conv1d(x, w, None, s1, qsl, slots, initial)
    torch.testing.assert_close(ops.causal_conv1d(x, w, None, s2, qsl, slots, initial, plan=plan), out, rtol=0, atol=0)
    torch.testing.assert_close(s2, s1, rtol=0, atol=0)


class _BrokenHook(hetero.Backend):
    name = "broken-hook"
    spec_version = hetero.SPEC_VERSION

    def plan_attention(self, meta, **sizes):
        raise RuntimeError("planner crashed")


def test_a_hook_that_crashes_turns_itself_off_and_the_ops_run_unplanned():
    from hetero.ops import Ops

    ops = Ops(_BrokenHook(), hetero.load("cpu_ref").backend, {})
    meta, q, k, v = _meta_and_inputs(torch.Generator().manual_seed(3))
    planned = ops.plan_attention(meta, num_tokens=7, num_blocks=9, block_size=16)
    assert planned.plan.data is None
    assert "planner crashed" in " ".join(ops.explain()["paged_attention"].reasons)
    torch.testing.assert_close(
        ops.paged_attention(q, k, v, planned, scale=0.1), ops.paged_attention(q, k, v, meta, scale=0.1)
    )
