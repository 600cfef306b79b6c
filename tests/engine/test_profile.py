"""``hetero profile`` (hetero.tools.profile) on tiny Qwen3, Qwen3-MoE and DeepSeek-V3 checkpoints, cpu_ref, float32.

The op table is checked against an ``OpCounter`` run of the same workload on a second,
identical engine: the same calls per (module path, op), so every op of the run is in it.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

pytest.importorskip("transformers")

from hetero.bench.devices import Ceilings
from hetero.bench.engine import Workload, run_workload
from hetero.cli import main
from hetero.engine import LLM
from hetero.engine.instrument import OpCounter, instrument, op_sites
from hetero.tools.profile import ALL, HOST_PARTS, Profiler, profile_run

WORKLOAD = Workload(3, (5, 20), (3, 5), seed=0)
#: a made-up device: 1 TFLOP/s float32, 0.1 TB/s
CEILINGS = Ceilings("test device", {"float32": 1.0}, 0.1, "made up for the test")
KINDS = {
    "qwen3": {"attention", "dense MLP", "other"},
    "qwen3_moe": {"attention", "MoE", "dense MLP", "other"},
    "deepseek_v3": {"attention", "MoE", "dense MLP", "other"},
}


def engine(path) -> LLM:
    return LLM(path, backend="cpu_ref", dtype="float32", max_num_seqs=8)


@pytest.fixture(scope="module", params=sorted(KINDS))
def profiled(request, checkpoints):
    """(arch, engine, report, the OpCounter of the same workload on another engine, the slots before)."""
    arch = request.param
    llm = engine(checkpoints(arch))
    slots = {(id(m), s.attr): getattr(m, s.attr) for m, s in op_sites(llm.runner.model)}
    report = profile_run(llm, WORKLOAD, warmup=0, ceilings=CEILINGS)
    twin, counter = engine(checkpoints(arch)), OpCounter()
    with instrument(twin.runner.model, counter):
        run_workload(twin, WORKLOAD, warmup=0)
    return arch, llm, report, counter, slots


def test_every_op_call_of_the_run_is_in_the_table(profiled):
    _, _, report, counter, _ = profiled
    assert Counter((c.path, c.op) for c in report.calls) == counter.calls
    table = report.ops()
    assert {op: row[ALL].calls for op, row in table.items()} == dict(counter.per_op())
    doc = report.as_dict()
    assert doc["total_calls"] == sum(counter.calls.values()) == sum(r["all"]["calls"] for r in doc["ops"].values())


def test_phases_and_layer_types(profiled):
    arch, _, report, _, _ = profiled
    assert {"prefill", "decode"} <= set(report.phases)
    assert {s.phase for s in report.steps} == {"prefill", "decode"}  # 3 requests fit one prefill step
    for row in [*report.ops().values(), *report.layers().values()]:
        assert row[ALL].calls == sum(f.calls for p, f in row.items() if p != ALL)
    assert set(report.layers()) == KINDS[arch]
    kind = {c.path: c.layer for c in report.calls}
    assert kind["lm_head"] == kind["model.norm"] == "other"
    assert all(c.layer == "attention" for c in report.calls if "attention" in c.op or c.op.startswith("write_"))
    assert all(c.layer == "MoE" for c in report.calls if c.op in ("route", "fused_moe"))
    if arch == "deepseek_v3":  # layer 0 dense (first_k_dense_replace), the shared experts belong to the MoE
        assert kind["model.layers.0.mlp.gate_up_proj"] == "dense MLP"
        assert kind["model.layers.1.mlp.shared_experts.down_proj"] == kind["model.layers.1.mlp.gate"] == "MoE"
        assert kind["model.layers.1.self_attn.q_a_proj"] == "attention"


def test_host_parts_add_up_to_the_step(profiled):
    _, _, report, _, _ = profiled
    host = report.host()
    assert set(host) == {ALL, "prefill", "decode"}
    assert host[ALL]["steps"] == len(report.steps) == host["prefill"]["steps"] + host["decode"]["steps"]
    for step in report.steps:
        assert all(v >= 0 for v in step.parts.values()) and step.seconds > 0
        assert step.parts["device wait"] == 0.0  # the CPU
        assert sum(step.parts.values()) == pytest.approx(step.seconds, rel=1e-6)
    doc = report.as_dict()
    ops_pct = sum(row["all"]["pct_of_step"] for row in doc["ops"].values())
    # on the CPU an op's time is the host time inside its call: ops and the other parts make up the step
    assert ops_pct == pytest.approx(100 * host[ALL]["op calls"] / host[ALL]["step"], rel=1e-6)
    others = sum(host[ALL][p] for p in HOST_PARTS if p != "op calls")
    assert ops_pct + 100 * others / host[ALL]["step"] == pytest.approx(100, rel=1e-6)


def test_achieved_rates_and_roofline(profiled):
    _, _, report, _, _ = profiled
    assert report.no_model == {}
    for op, row in report.ops().items():
        f = row[ALL]
        assert f.modelled == f.calls and f.bytes > 0, op
        assert f.gb_s == pytest.approx(f.bytes / f.seconds / 1e9)
        assert f.tflop_s == pytest.approx(f.flops / f.seconds / 1e12)
        ideal = sum(max(c.work.flops / 1e12, c.work.bytes / 0.1e12) for c in report.calls if c.op == op)
        assert f.roofline == pytest.approx(ideal / f.seconds)
    hidden, vocab = 64, 256
    heads = [c for c in report.calls if c.path == "lm_head" and c.phase == "decode"]
    assert heads
    for c in heads:  # the lm_head of a decode step: one row per sequence, [S, H] @ [V, H]^T
        rows = report.steps[c.step].tokens
        assert c.work.flops == 2.0 * rows * vocab * hidden
        assert c.work.bytes == 4 * (rows * hidden + vocab * hidden + rows * vocab)


def test_the_trace_has_one_event_per_op_call(profiled, tmp_path):
    _, _, report, _, _ = profiled
    report.write_trace(tmp_path / "trace.json")
    events = [e for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"] if e["ph"] == "X"]
    assert len(events) == len(report.calls) == sum(row[ALL].calls for row in report.ops().values())
    assert Counter(e["name"] for e in events) == Counter({op: row[ALL].calls for op, row in report.ops().items()})
    assert all(e["dur"] >= 0 and e["args"]["phase"] in ("prefill", "decode") for e in events)
    starts = [e["ts"] for e in events]
    assert starts == sorted(starts)


def test_profiling_leaves_the_engine_as_it_was(profiled):
    _, llm, _, _, slots = profiled
    for module, site in op_sites(llm.runner.model):
        assert getattr(module, site.attr) is slots[id(module), site.attr]
        assert "_instrumented_ops" not in vars(module)
    for owner, attr in (
        (llm, "step"),
        (llm.scheduler, "schedule"),
        (llm.scheduler, "postprocess"),
        (llm.runner.buffers, "fill"),
    ):
        assert attr not in vars(owner)
    assert type(llm.runner.sampler).__name__ == "Sampler"
    with Profiler(llm):  # nothing left instrumented: profiling again is allowed
        pass


def test_cli_json_and_trace(checkpoints, capsys, tmp_path):
    trace = tmp_path / "t.json"
    argv = [
        "profile",
        "--model",
        str(checkpoints("qwen3")),
        "--backend",
        "cpu_ref",
        "--dtype",
        "float32",
        "--json",
        "--num-requests",
        "2",
        "--input-len",
        "4:9",
        "--output-len",
        "2:3",
        "--warmup",
        "1",
        "--trace",
        str(trace),
    ]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["run"]["requests"] == 2 and doc["run"]["backend"] == "cpu_ref"
    assert {"gemm", "paged_attention", "rms_norm"} <= set(doc["ops"])
    assert doc["ops"]["gemm"]["all"]["gb_s"] > 0 and doc["ops"]["gemm"]["all"]["roofline_fraction"] is None
    assert "no ceilings known" in doc["ceilings_note"]
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    assert len(events) == doc["total_calls"]


def test_cli_table(checkpoints, capsys):
    argv = [
        "profile",
        "--model",
        str(checkpoints("qwen3")),
        "--backend",
        "cpu_ref",
        "--num-requests",
        "1",
        "--input-len",
        "4",
        "--output-len",
        "2",
        "--warmup",
        "0",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for text in ("paged_attention", "roofline", "prefill", "decode", "dense MLP", "scheduler", "other host"):
        assert text in out


@pytest.mark.parametrize("option, value", [("--num-requests", "0"), ("--warmup", "-1"), ("--block-size", "x")])
def test_bad_option_values_are_usage_errors(checkpoints, capsys, option, value):
    with pytest.raises(SystemExit) as exit_:
        main(["profile", "--model", str(checkpoints("qwen3")), "--backend", "cpu_ref", option, value])
    assert exit_.value.code == 2
    assert option in capsys.readouterr().err


@pytest.mark.parametrize(
    "option, value",
    [("--input-len", "9:2"), ("--trace", "/nonexistent/dir/t.json"), ("--ceilings", "/nonexistent.json")],
)
def test_unusable_values_are_usage_errors(checkpoints, capsys, option, value):
    argv = [
        "profile",
        "--model",
        str(checkpoints("qwen3")),
        "--backend",
        "cpu_ref",
        "--num-requests",
        "1",
        "--input-len",
        "4",
        "--output-len",
        "2",
        "--warmup",
        "0",
        option,
        value,
    ]
    assert main(argv) == 2
    assert f"argument {option}" in capsys.readouterr().err


def test_decodes_batched_with_prompt_chunks_are_a_mixed_phase(checkpoints):
    """A token budget smaller than the prompts makes the scheduler put decodes and prompt chunks in one step."""
    llm = LLM(checkpoints("qwen3"), backend="cpu_ref", dtype="float32", max_num_seqs=8, max_num_batched_tokens=16)
    report = profile_run(llm, Workload(4, (20, 30), (4, 6), seed=1), warmup=0, ceilings=CEILINGS)
    phases = {s.phase for s in report.steps}
    assert {"prefill", "mixed", "decode"} <= phases
    mixed = [c for c in report.calls if c.phase == "mixed"]
    assert mixed and {c.op for c in mixed} >= {"gemm", "paged_attention"}
