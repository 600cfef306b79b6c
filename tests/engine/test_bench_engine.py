"""`hetero bench-engine`: the workload, the latency math, the report and the baseline decision."""

from __future__ import annotations

import json

import pytest

from hetero.bench.engine import Workload, parse_range, percentiles, request_latencies, summarize
from hetero.cli import main
from hetero.engine.llm import RequestOutput

SMALL = [
    "--backend",
    "cpu_ref",
    "--dtype",
    "float32",
    "--input-len",
    "4:40",
    "--output-len",
    "1:12",
    "--seed",
    "3",
    "--warmup",
    "1",
]


def _output(arrival: float, first: float, finish: float, num_out: int, prompt_len: int = 5) -> RequestOutput:
    metrics = dict(
        arrival_time=arrival, first_token_time=first, finish_time=finish, num_cached_tokens=0, num_preemptions=0
    )
    return RequestOutput("r", [1] * prompt_len, [7] * num_out, None, "length", metrics)


def test_latencies_and_percentiles_by_hand():
    outs = [_output(10.0, 10.5, 12.5, 5), _output(10.0, 11.0, 11.0, 1), _output(11.0, 11.25, 13.25, 9)]
    lat = request_latencies(outs)
    assert lat["ttft"] == [0.5, 1.0, 0.25]
    assert lat["tpot"] == [0.5, 0.25]  # 2.0 s over 4 gaps, 2.0 s over 8 gaps; one output token has no TPOT
    assert lat["e2e"] == [2.5, 1.0, 2.25]
    p = percentiles(list(range(1, 101)))
    assert p == pytest.approx({"mean": 50.5, "p50": 50.5, "p90": 90.1, "p99": 99.01})
    assert percentiles([]) == {"mean": None, "p50": None, "p90": None, "p99": None}


def test_summarize_throughput_and_kv_cache():
    outs = [_output(0.0, 0.5, 2.5, 5, prompt_len=10), _output(0.0, 1.0, 1.0, 1, prompt_len=30)]
    stats = dict(
        num_kv_blocks=8,
        block_size=16,
        steps=3,
        preemptions=1,
        cached_prompt_tokens=16,
        kv_blocks_in_use=[2, 4, 6],
        step_tokens=[40, 2, 1],
        step_seconds=[0.1, 0.1, 0.1],
    )
    s = summarize(outs, stats, elapsed=2.0)
    assert (s["requests"], s["prompt_tokens"], s["output_tokens"]) == (2, 40, 6)
    assert (s["request_throughput"], s["output_throughput"], s["total_throughput"]) == (1.0, 3.0, 23.0)
    assert s["kv_cache"] == {"num_blocks": 8, "block_size": 16, "mean_utilization": 0.5, "peak_utilization": 0.75}
    assert (s["preemptions"], s["cached_prompt_tokens"], s["steps"]) == (1, 16, 3)
    assert s["ttft_s"]["p50"] == 0.75 and s["tpot_s"]["mean"] == 0.5


def test_workload_draw_is_seeded_and_within_ranges():
    w = Workload(200, (4, 40), (1, 12), seed=3)
    prompts, out_lens = w.draw(vocab_size=50)
    assert [len(p) for p in prompts] == w.lengths()[0] and out_lens == w.lengths()[1]
    assert min(map(len, prompts)) == 4 and max(map(len, prompts)) == 40  # inclusive on both ends
    assert min(out_lens) == 1 and max(out_lens) == 12
    assert all(0 <= t < 50 for p in prompts for t in p)
    assert w.draw(50) == (prompts, out_lens)
    other, lens = w.draw(50, variant=1)
    assert lens == out_lens and [len(p) for p in other] == [len(p) for p in prompts] and other != prompts
    assert Workload(200, (4, 40), (1, 12), seed=4).lengths() != w.lengths()
    assert parse_range("32:256") == (32, 256) and parse_range("7") == (7, 7)
    for bad in ("0:4", "9:3", "a:b", "1:2:3"):
        with pytest.raises(ValueError):
            parse_range(bad)


@pytest.fixture(scope="module")
def baseline(checkpoints, tmp_path_factory):
    """One measured run of 8 requests: its --json document and its --save baseline."""
    d = tmp_path_factory.mktemp("bench")
    model = str(checkpoints("qwen3"))
    argv = [
        "bench-engine",
        "--model",
        model,
        "--num-requests",
        "8",
        *SMALL,
        "--json",
        str(d / "run.json"),
        "--save",
        str(d / "base.json"),
    ]
    assert main(argv) == 0
    return model, json.loads((d / "run.json").read_text()), d / "base.json"


def test_report_and_json_are_consistent(baseline):
    _, doc, _ = baseline
    m = doc["metrics"]
    drawn = Workload(8, (4, 40), (1, 12), seed=3).lengths()
    assert doc["workload"]["prompt_lens"] == drawn[0] and doc["workload"]["output_lens"] == drawn[1]
    assert m["requests"] == 8 and m["output_tokens"] == sum(drawn[1]) and m["prompt_tokens"] == sum(drawn[0])
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert 0 < m[key]["p50"] <= m[key]["p90"] <= m[key]["p99"]
    assert m["ttft_s"]["p99"] <= m["e2e_s"]["p99"]
    assert 0 < m["kv_cache"]["mean_utilization"] <= m["kv_cache"]["peak_utilization"] <= 1
    assert m["output_throughput"] == pytest.approx(m["output_tokens"] / m["elapsed_s"])
    assert m["steps"] >= max(drawn[1]) and m["cached_prompt_tokens"] == 0  # the warm-up shares no prefix
    env = doc["environment"]
    assert env["backend"] == "cpu_ref" and env["device"].startswith("cpu/") and "thread" in env["device"]
    assert env["model"]["architecture"] == "Qwen3ForCausalLM"
    assert env["workload"] == {"num_requests": 8, "input_len": [4, 40], "output_len": [1, 12], "seed": 3}
    assert {x["name"] for x in doc["baseline_metrics"]} == {
        "output_throughput",
        "ttft_p50",
        "ttft_p90",
        "tpot_p50",
        "tpot_p90",
    }


def test_table_shows_throughput_and_percentiles(baseline, capsys):
    model, _, _ = baseline
    assert main(["bench-engine", "--model", model, "--num-requests", "4", *SMALL, "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    for text in ("requests/s", "output tok/s", "total tok/s", "TTFT", "TPOT", "p50", "p90", "p99", "KV cache"):
        assert text in out


def test_compare_with_a_generous_threshold_passes(baseline, capsys):
    model, _, base = baseline
    argv = [
        "bench-engine",
        "--model",
        model,
        "--num-requests",
        "8",
        *SMALL,
        "--compare",
        str(base),
        "--threshold",
        "1000",
    ]
    assert main(argv) == 0
    assert "output_throughput" in capsys.readouterr().out


def test_a_far_faster_baseline_is_a_regression(baseline, tmp_path, capsys):
    model, _, base = baseline
    doc = json.loads(base.read_text())
    for metric in doc["metrics"]:
        # throughput far above anything this machine reaches, latencies far above anything it could take:
        # only the throughput can regress, however loaded the machine is (this tests the decision, not timing)
        metric["value"] *= 100 if metric["name"] == "output_throughput" else 1000
    edited = tmp_path / "faster.json"
    edited.write_text(json.dumps(doc))
    argv = [
        "bench-engine",
        "--model",
        model,
        "--num-requests",
        "8",
        *SMALL,
        "--compare",
        str(edited),
        "--json",
        str(tmp_path / "run.json"),
    ]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "regressed" in err and "output_throughput" in err
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["regressed"] == ["output_throughput"] and len(run["runs"]) == 2  # measured once more
    row = next(c for c in run["comparison"] if c["name"] == "output_throughput")
    assert row["spread"][0] <= row["current"] == row["spread"][2]  # the better of the two runs is kept


def test_another_workload_is_not_compared(baseline, capsys):
    model, _, base = baseline
    argv = ["bench-engine", "--model", model, "--num-requests", "9", *SMALL, "--compare", str(base)]
    assert main(argv) == 2
    assert "workload" in capsys.readouterr().err
    assert main(["bench-engine", "--model", model, *SMALL, "--input-len", "300:400", "--output-len", "300:400"]) == 2
    assert "max_position_embeddings" in capsys.readouterr().err


def test_threads_are_part_of_the_key_and_restored(baseline, tmp_path, capsys):
    import torch

    model, doc, base = baseline
    before = torch.get_num_threads()
    other = 1 if before != 1 else 2
    argv = ["bench-engine", "--model", model, "--num-requests", "8", *SMALL, "--threads", str(other)]
    assert main([*argv, "--json", str(tmp_path / "t.json")]) == 0
    assert torch.get_num_threads() == before
    run = json.loads((tmp_path / "t.json").read_text())
    assert f"({other} thread" in run["environment"]["device"] and f"--threads {other}" in run["command"]
    assert run["environment"]["device"] != doc["environment"]["device"]
    assert main([*argv, "--compare", str(base)]) == 2  # a baseline taken at another thread count is not compared
    assert main(["bench-engine", "--model", model, *SMALL, "--threads", "0"]) == 2
