"""The baseline format, the byte/flop model by hand, device ceilings and the roofline fraction."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

import hetero
from hetero.bench.baseline import (
    SCHEMA,
    BaselineError,
    Comparison,
    Metric,
    check_environment,
    compare,
    confirm,
    environment,
    load_baseline,
    save_baseline,
)
from hetero.bench.devices import find_ceilings, load_ceilings, roofline
from hetero.bench.model import Work, attention_pairs, work
from hetero.bench.perf import TIERS, UNBENCHED, perf_cases
from hetero.spec import OP_NAMES, OPS, AttentionMeta

ENV = {"backend": "cpu_ref", "device": "cpu/x", "python": "3.11.7", "platform": "p", "versions": {"torch": "2.13.0"}}


def test_round_trip(tmp_path):
    metrics = [
        Metric("gemm/perf/a/float32", 0.5, "s", samples=(0.4, 0.5, 0.6)),
        Metric("throughput_tok_s", 120.0, "tok/s", higher_is_better=True),
    ]
    save_baseline(tmp_path / "b.json", "engine", ENV, metrics, "hetero bench-engine x")
    doc = json.loads((tmp_path / "b.json").read_text())
    assert doc["schema"] == SCHEMA and doc["kind"] == "engine" and doc["command"] == "hetero bench-engine x"
    env, loaded = load_baseline(tmp_path / "b.json", "engine")
    assert env == ENV and list(loaded.values()) == metrics


def test_unusable_baselines_raise(tmp_path):
    path = tmp_path / "b.json"
    with pytest.raises(BaselineError, match="no baseline at"):
        load_baseline(path, "ops")
    save_baseline(path, "engine", ENV, [], "c")
    with pytest.raises(BaselineError, match="kind 'engine', expected 'ops'"):
        load_baseline(path, "ops")
    path.write_text(json.dumps({"schema": "hetero-bench-baseline/2", "kind": "ops"}))
    with pytest.raises(BaselineError, match="schema 'hetero-bench-baseline/2'"):
        load_baseline(path, "ops")
    path.write_text(json.dumps({"schema": SCHEMA, "kind": "ops", "environment": ENV, "metrics": [{"name": "x"}]}))
    with pytest.raises(BaselineError, match="malformed metric"):
        load_baseline(path, "ops")
    with pytest.raises(BaselineError, match="kind must be one of"):
        save_baseline(path, "op", ENV, [], "c")
    with pytest.raises(BaselineError, match="duplicate metric names: a"):
        save_baseline(path, "ops", ENV, [Metric("a", 1, "s"), Metric("a", 2, "s")], "c")


def test_environment_key_and_version_warnings():
    current = environment("cpu_ref", "cpu/x", {"hetero-cpu-ref": "0.1.0"})
    assert current["versions"]["hetero-cpu-ref"] == "0.1.0" and "torch" in current["versions"]
    assert "hetero" in current["versions"] and current["python"]
    error, _ = check_environment({**current, "device": "cuda/NVIDIA H200"}, current)
    assert error is not None and "device 'cuda/NVIDIA H200'" in error
    error, _ = check_environment({**current, "backend": "cuda"}, current)
    assert error is not None and "backend 'cuda'" in error
    older = {**current, "versions": {**current["versions"], "torch": "2.6.0", "gone": "1.0"}}
    error, warnings = check_environment(older, current)
    assert error is None and len(warnings) == 2
    assert any("torch 2.6.0 in the baseline" in w for w in warnings) and any("gone 1.0" in w for w in warnings)
    assert check_environment(current, current) == (None, [])


def test_compare_directions_and_missing_metrics():
    saved = {m.name: m for m in [Metric("t", 1.0, "s"), Metric("tok", 100.0, "tok/s", True), Metric("old", 1.0, "s")]}
    got = {
        c.name: c
        for c in compare(
            saved, [Metric("t", 1.3, "s"), Metric("tok", 80.0, "tok/s", True), Metric("new", 2.0, "s")], threshold=0.25
        )
    }
    assert got["t"].change == pytest.approx(0.3) and got["t"].regressed
    assert got["tok"].change == pytest.approx(0.2) and not got["tok"].regressed  # 20% lower throughput
    faster = compare(saved, [Metric("t", 0.5, "s"), Metric("tok", 150.0, "tok/s", True)], 0.1)
    assert [c.change for c in faster[:2]] == [pytest.approx(-0.5), pytest.approx(-0.5)]
    assert not got["new"].regressed and math.isnan(got["new"].baseline) and got["new"].note == "not in the baseline"
    assert not got["old"].regressed and math.isnan(got["old"].current) and got["old"].note == "not measured in this run"
    with pytest.raises(BaselineError, match="unit"):
        compare(saved, [Metric("t", 1.0, "ms")], 0.1)


def test_confirm_keeps_the_best_remeasurement():
    flagged = Comparison("t", 1.0, 2.0, 1.0, True)
    noise = confirm(flagged, [1.05, 1.9, 1.1], threshold=0.1)
    assert not noise.regressed and noise.current == 1.05 and noise.spread == (1.05, 1.5, 2.0)
    real = confirm(flagged, [1.9, 2.1, 2.0], threshold=0.1)
    assert real.regressed and real.change == pytest.approx(0.9) and real.spread == (1.9, 2.0, 2.1)
    up = confirm(Comparison("tok", 100.0, 50.0, 0.5, True), [90.0], threshold=0.2, higher_is_better=True)
    assert not up.regressed and up.current == 90.0


def test_gemm_work_by_hand():
    a, b = torch.zeros(16, 4096), torch.zeros(1024, 4096, dtype=torch.bfloat16)
    bias = torch.zeros(1024, dtype=torch.bfloat16)
    w = work("gemm", {"a": a.bfloat16(), "b": b, "bias": bias, "out_dtype": torch.float32})
    assert w.flops == 2 * 16 * 1024 * 4096 + 16 * 1024
    assert w.bytes == 2 * 16 * 4096 + 2 * 1024 * 4096 + 2 * 1024 + 4 * 16 * 1024


def test_paged_attention_work_by_hand():
    # sequence 0 decodes one token at position 4 (5 keys); sequence 1 prefills 3 tokens (1 + 2 + 3 pairs)
    meta = AttentionMeta.build([1, 3], [5, 3], [[2, 0], [1, 3]])
    hq, hkv, d = 4, 2, 8
    inputs = {
        "query": torch.zeros(4, hq, d),
        "k_cache": torch.zeros(4, 4, hkv, d),
        "v_cache": torch.zeros(4, 4, hkv, d),
        "meta": meta,
        "scale": 0.3,
    }
    w = work("paged_attention", inputs)
    pairs, keys = 5 + 6, 5 + 3
    assert w.flops == 2 * pairs * hq * (d + d)
    meta_bytes = 4 * (3 + 2 + 4)
    assert w.bytes == 4 * (4 * hq * d) + 4 * keys * hkv * 2 * d + 4 * (4 * hq * d) + meta_bytes
    # a left window of 1: the decode row sees positions 3..4, the prefill rows 1 + 2 + 2
    assert attention_pairs([1, 3], [5, 3], True, (1, -1)) == (2 + 5, 2 + 3)
    assert attention_pairs([2], [4], False) == (8, 4)


def test_every_op_has_perf_cases_except_the_multi_rank_ones():
    for tier in TIERS:
        ops = {c.op for c in perf_cases(tier)}
        assert ops == set(OP_NAMES) - set(UNBENCHED), tier
        assert all(c.shape.startswith("perf/") for c in perf_cases(tier))
    floats = {c.dtype for c in perf_cases("full") if c.op != "rejection_sample"}  # its probabilities: float32
    assert floats == {"bfloat16", "float8_e4m3fn"}


def test_quick_cases_keep_outputs_below_the_mmap_threshold():
    """No quick case's output reaches 32 MiB, where glibc maps a fresh block per call (see perf.py)."""
    ref = hetero.load("cpu_ref")
    for case in perf_cases("quick"):
        bound = OPS[case.op].signature.bind(**case.inputs(0))
        sizes = [t.nbytes for t in _tensors(getattr(ref, case.op)(*bound.args, **bound.kwargs))]
        assert all(n < 32 << 20 for n in sizes), (case.id, sizes)


def _tensors(result: object) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (tuple, list)):
        return [t for r in result for t in _tensors(r)]
    if dataclasses.is_dataclass(result):
        return [t for f in dataclasses.fields(result) for t in _tensors(getattr(result, f.name))]
    return []


def test_ceilings_table_override_and_unknown_device(tmp_path):
    h200, note = find_ceilings("cuda/NVIDIA H200")
    assert note == "" and h200.tb_s == 4.8 and h200.tflops["bfloat16"] == 989.5
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"name": "H200 (measured)", "tflops": {"bfloat16": 790}, "tb_s": 4.3}))
    measured, _ = find_ceilings("cuda/NVIDIA H200", load_ceilings(path))
    assert measured.tflops["bfloat16"] == 790 and measured.tflops["float8"] == 1979.0 and measured.tb_s == 4.3
    unknown, reason = find_ceilings("cpu/AMD EPYC")
    assert unknown is None and "no ceilings known for 'cpu/AMD EPYC'" in reason and "--ceilings" in reason
    path.write_text(json.dumps({"tflops": {"bfloat16": -1}}))
    with pytest.raises(ValueError, match="positive"):
        load_ceilings(path)


def test_roofline_fraction():
    ceilings, _ = find_ceilings("cpu/toy", {"name": "toy", "tflops": {"float32": 1.0}, "tb_s": 0.5})
    compute_bound, memory_bound = Work(4e12, 1e9), Work(1e9, 1e12)
    assert roofline(compute_bound, 8.0, "float32", ceilings) == (pytest.approx(0.5), "")  # 4 s of peak in 8 s
    assert roofline(memory_bound, 4.0, "float32", ceilings) == (pytest.approx(0.5), "")  # 2 s of bandwidth in 4 s
    assert roofline(compute_bound, 8.0, "bfloat16", ceilings)[0] == pytest.approx(
        2e-3 / 8
    )  # no bf16 peak: bandwidth only
    assert roofline(memory_bound, 4.0, "float32", None) == (None, "device ceilings unknown")
