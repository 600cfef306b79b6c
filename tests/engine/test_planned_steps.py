"""The engine plans each step once (spec 1.6) and every layer reads the plan: on the torch backend,
greedy tokens with the plans are those without, for a paged-attention model, a hybrid one (the
recurrent ops' ``plan=``) and an MLA one; and each step's planned metadata reaches the layers."""

from __future__ import annotations

import pytest

pytest.importorskip("hetero_torch")

from _hf import prompts  # noqa: E402

from hetero.engine import LLM, SamplingParams  # noqa: E402
from hetero.spec import validate  # noqa: E402


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_next", "deepseek_v3"])
def test_planned_steps_give_the_unplanned_tokens(arch, checkpoints, monkeypatch):
    llm = LLM(str(checkpoints(arch)), backend="torch", dtype="float32", max_num_batched_tokens=48)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    ids = prompts(200, [5, 33, 70, 2])  # 70 > 48: a chunked prefill beside decodes
    runner = llm.runner
    seen = []
    real = runner._plan

    def spy(step):
        planned = real(step)
        seen.append((planned.meta.plan, planned.state_plan))
        return planned

    runner._plan = spy
    checked = []  # the ops whose metadata the registry checked (validation is on for CPU tensors)
    real_check = validate.check_meta
    monkeypatch.setattr(validate, "check_meta", lambda op, *a: checked.append(op) or real_check(op, *a))
    assert runner.plans and runner.ops.validate
    with_plans = [list(o.token_ids) for o in llm.generate(ids, params, progress=False)]
    assert seen and all(p is not None and p.data is not None for p, _ in seen)
    assert all((s is not None and s.data is not None) == (arch == "qwen3_next") for _, s in seen)
    assert checked == []  # once per step in the hook, never per layer
    runner.plans = False
    assert [list(o.token_ids) for o in llm.generate(ids, params, progress=False)] == with_plans
    assert checked  # unplanned, every layer's call is checked
