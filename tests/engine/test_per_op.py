"""`check-model --per-op`: the op call at fault in a real run, told apart from accumulated rounding."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import hetero
import hetero.registry
import hetero_cpu_ref.plugin
from hetero.tools.check import ModelCheck
from hetero.tools.replay import per_op_check
from hetero.tools.tiny import ARCHS

#: prompts long enough to reach positions past 64 (the tiny checkpoints hold 512)
LONG = [list(range(3, 83)), list(range(100, 121))]


class _Plugin:
    """docs/examples/hetero-demo-bug's backend: paged_attention 3% off at positions >= 64 when head_dim < 64."""

    @hetero.hookimpl
    def hetero_backends(self):
        sys.path.insert(0, str(Path(__file__).parents[2] / "docs" / "examples" / "hetero-demo-bug"))
        try:
            from hetero_demo_bug import DemoBugBackend
        finally:
            sys.path.pop(0)

        class LateBug(DemoBugBackend):  # reached only by decode steps after a 30-token prompt
            name, from_position = "late_bug", 40

        return [DemoBugBackend, LateBug]


@pytest.fixture
def planted(monkeypatch):
    """hetero.load (and so the engine) sees the reference and the planted backend only."""
    registry = hetero.Registry(entry_points=[])
    registry.register(hetero_cpu_ref.plugin, "cpu_ref")
    registry.register(_Plugin(), "planted")
    monkeypatch.setattr(hetero.registry, "default_registry", lambda: registry)
    return registry


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    from hetero.tools import tiny

    return tiny.build("qwen3", tmp_path_factory.mktemp("qwen3"))


def test_the_quick_tier_misses_the_planted_bug(planted):
    from hetero_conformance.cases import catalog
    from hetero_conformance.runner import Runner

    runner = Runner(planted.load("demo_bug"), planted.backends["cpu_ref"].cls())
    results = [runner.run(c) for c in catalog(quick=True) if c.op == "paged_attention" and c.dtype == "float32"]
    assert results and all(r.status == "pass" for r in results), [
        (r.id, r.message) for r in results if r.status != "pass"
    ]


def test_per_op_names_the_op_and_its_first_layer(planted, qwen3):
    check = ModelCheck(qwen3, "demo_bug")
    assert check.run(LONG, max_tokens=2).first_bad == "layer 0"  # the stream fails from the first layer
    report = per_op_check(str(qwen3), "demo_bug", LONG, max_tokens=2)
    fault = report.first_fault
    assert (fault.op, fault.layer, fault.module) == ("paged_attention", 0, "self_attn.attn")
    assert "relative L2" in fault.problems[0] or "max abs" in fault.problems[0]
    bad = {(r.layer, r.op) for r in report.rows if r.failed}
    assert bad == {(layer, "paged_attention") for layer in range(2)}  # every other op is within its bounds
    assert report.verdict().startswith("op at fault: paged_attention in layer 0")


def test_short_prompts_do_not_reach_the_bug(planted, qwen3):
    report = per_op_check(str(qwen3), "demo_bug", [[5, 6, 7, 8]], max_tokens=3)
    assert report.passed and len(report.calls) > 20


def test_recording_is_bounded_and_says_what_it_skipped(qwen3):
    report = per_op_check(str(qwen3), "cpu_ref", LONG, max_tokens=6, samples=2)
    per_site = {}
    for v in report.calls:
        per_site[v.path, v.op] = per_site.get((v.path, v.op), 0) + 1
    assert max(per_site.values()) == 2
    skipped = {(s["op"], s["reason"]): s["calls"] for s in report.skipped}
    assert skipped[("paged_attention", "not sampled")] == 2 * (6 - 2)  # 2 layers x 6 steps, 2 kept each
    capped = per_op_check(str(qwen3), "cpu_ref", LONG, max_tokens=2, max_bytes=200_000)
    assert capped.recorded_bytes <= 200_000 and any(s["reason"] == "store cap reached" for s in capped.skipped)
    assert capped.unrecorded and capped.status() == "inconclusive" and not capped.passed  # not "no op at fault"
    assert capped.verdict().startswith("inconclusive: no replayed op call is out of bounds, but")


def test_a_bug_only_late_in_decode_is_still_sampled(planted, qwen3):
    """Calls 0 and 1 of each site, then the latest of calls 2, 4, 8, 16: decode step 16 reaches position 45."""
    report = per_op_check(str(qwen3), "late_bug", [list(range(3, 33))], max_tokens=20)
    fault = report.first_fault
    assert (fault.op, fault.layer) == ("paged_attention", 0)
    attention = [v for v in report.calls if v.path == "model.layers.0.self_attn.attn" and v.op == "paged_attention"]
    assert len(attention) == 4 and attention[-1].index > attention[-2].index > attention[1].index


def test_weights_are_stored_once_and_a_replay_failure_is_not_a_fault(qwen3, monkeypatch):
    from hetero.engine import LLM, SamplingParams
    from hetero.engine.instrument import instrument
    from hetero.tools.replay import OpRecorder, Replayer, TensorStore

    llm = LLM(str(qwen3), backend="cpu_ref", dtype="float32")
    with TensorStore(1 << 30) as store:
        recorder = OpRecorder(store, 4, model=llm.runner.model)
        with instrument(llm.runner.model, recorder):
            llm.generate(LONG, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True), progress=False)
        gemms = [r for r in recorder.records if r.op == "gemm"]
        assert len(gemms) == 9 * 4 and all("in.b.0" in r.shared for r in gemms)  # 9 gemm sites, 4 calls each
        assert len({r.shared["in.b.0"] for r in gemms}) == 9  # each weight stored once
        assert all("in.b.0" not in store.get(r.file) for r in gemms)
        assert Replayer(store, torch.float32).replay(gemms[-1]).ok

    def broken(self, record, inputs):
        raise RuntimeError("the replay's own bug")

    monkeypatch.setattr(Replayer, "_expected", broken)
    failed = per_op_check(str(qwen3), "cpu_ref", [[5, 6, 7]], max_tokens=1)
    assert (
        failed.first_fault is None and failed.status() == "inconclusive" and "could not be replayed" in failed.verdict()
    )


def test_compaction_keeps_what_a_call_reads_and_writes():
    """A paged call on the blocks it names only (renumbered) computes what it computes on the whole cache."""
    from hetero.spec.types import AttentionMeta
    from hetero.tools.replay._compact import compaction

    gen = torch.Generator().manual_seed(0)
    k, v = (torch.randn(40, 4, 2, 8, generator=gen) for _ in range(2))
    meta = AttentionMeta.build([3, 1], [7, 5], [[31, 2, 17, 0], [9, 22, 5, 5]])
    args = dict(query=torch.randn(4, 4, 8, generator=gen), k_cache=k, v_cache=v, meta=meta, scale=0.3)
    cut = compaction(args)
    assert cut.blocks.tolist() == [2, 9, 22, 31]  # 17 and 5 lie past the sequences' lengths
    small = cut.arguments(args)
    assert small["k_cache"].shape[0] == 4 and small["meta"].block_table.tolist()[0][:2] == [3, 0]
    ops = hetero.load("cpu_ref")
    assert torch.equal(ops.paged_attention(**small), ops.paged_attention(**args))
    slots = torch.tensor([31 * 4 + 3, -1, 9 * 4])
    write = compaction(dict(key=k[0, :3], value=v[0, :3], k_cache=k, v_cache=v, slot_mapping=slots))
    assert write.arguments(dict(k_cache=k, v_cache=v, slot_mapping=slots))["slot_mapping"].tolist() == [7, -1, 0]


def test_store_round_trips_every_dtype_bit_for_bit(tmp_path):
    from hetero.tools.replay import TensorStore

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, 3, generator=gen)
    tensors = {
        "f8": x.to(torch.float8_e4m3fn),
        "fnuz": x.to(torch.float8_e4m3fnuz),
        "i8": (x * 50).to(torch.int8),
        "bf16": x.to(torch.bfloat16),
        "bool": x > 0,
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
    }
    with TensorStore(1 << 20, root=tmp_path) as store:
        assert store.put(0, tensors)
        back = store.get(0)
        assert not store.put(1, {"big": torch.zeros(1 << 18)})  # 1 MiB more than the cap allows
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape
        assert torch.equal(back[name].reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8))


def test_each_rank_replays_its_own_calls_under_tp2(qwen3, tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from hetero.distributed import free_port

    worker = Path(__file__).with_name("_per_op_worker.py")
    out = tmp_path / "out.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        str(worker),
        str(qwen3),
        "cpu_ref",
        str(out),
    ]
    run = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    reports = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(2)]
    assert [r["rank"] for r in reports] == [0, 1] and all(r["passed"] for r in reports)
    for r in reports:  # each rank's qkv_proj is its column share: (4 + 2 + 2) heads of 32 over 2 ranks
        qkv = next(c for c in r["calls"] if c["module"] == "self_attn.qkv_proj")
        assert qkv["shapes"]["out"][-1] == (4 + 2 * 2) * 32 // 2


@pytest.mark.parametrize("option, value", [("--per-op-samples", "0"), ("--per-op-max-mb", "-1"), ("--tolerance", "0")])
def test_bad_per_op_options_are_usage_errors(qwen3, capsys, option, value):
    from hetero.cli import main

    assert main(["check-model", str(qwen3), "--backend", "cpu_ref", "--per-op", option, value]) == 2
    assert f"argument {option}" in capsys.readouterr().err


#: releases whose text model is another tiny arch's, op for op (tests/engine/test_wrappers.py checks them)
SAME_OPS = {"qwen3_5_vl", "qwen3_5_moe_vl", "kimi_k25"}


@pytest.mark.parametrize("arch", sorted(set(ARCHS) - SAME_OPS))
def test_every_architecture_replays_within_bounds(arch, tmp_path):
    """Each architecture's op calls (MLA, DSA's indexer, linear attention's recurrent state, gpt-oss's sinks and
    windows, MoE) record and replay; the reference backend agrees with itself in float64's eyes."""
    from hetero.engine import LLM, SamplingParams
    from hetero.engine.instrument import OpCounter, instrument
    from hetero.tools import tiny

    model = tiny.build(arch, tmp_path / arch)
    report = per_op_check(str(model), "cpu_ref", [list(range(3, 40)), [7, 8]], max_tokens=3, samples=2)
    assert report.passed, report.verdict()
    llm = LLM(str(model), backend="cpu_ref", dtype="float32")
    counter = OpCounter()
    with instrument(llm.runner.model, counter):
        llm.generate(
            [list(range(3, 40)), [7, 8]], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True), progress=False
        )
    assert {v.op for v in report.calls} == set(counter.per_op()) - {"ep_dispatch", "ep_combine"}
