"""benchmarks/engine_vs_vllm.py's hetero-only path end to end (no vLLM started), and its argument checks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "engine_vs_vllm.py"


@pytest.fixture(scope="module")
def script():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import engine_vs_vllm
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return engine_vs_vllm


def test_hetero_configs_run_and_agree(tmp_path):
    """Two hetero configs, one tiny workload each: a row per config, positive rates, the same greedy tokens."""
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--quick",
            "--configs",
            "hetero-torch,hetero-cpu_ref",
            "--requests",
            "4",
            "--max-tokens",
            "4",
            "--models",
            "qwen3",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"hetero-torch", "hetero-cpu_ref"}
    for row in rows.values():
        assert row["status"] == "ok" and row["model"] == "qwen3" and row["tok_s"] > 0 and row["timed"] == 1
        assert row["reference"] == "hetero-cpu_ref" and row["requests"] == 4
    assert rows["hetero-torch"]["identical"] == 4
    assert "| hetero-torch |" in proc.stdout and "fastest hetero config" in proc.stdout


def test_quick_picks_its_subset_and_caps_nothing(script):
    args = script.parse(["--quick"])
    assert [c.name for c in args.configs] == ["hetero-torch", "hetero-cpu_ref", "vllm-eager", "hf-batched"]
    assert (args.requests, args.repeats, args.inner, args.max_tokens) == (8, 1, 1, None)
    cuda = script.parse(["--device", "cuda", "--quick"])
    assert [c.name for c in cuda.configs] == ["hetero-cuda", "hetero-torch", "vllm-eager", "hf-batched"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--configs", "hetero-torch,nope"], "--configs takes names from"),
        (["--configs", "hetero-cuda"], "--configs takes names from"),
        (["--models", "llama"], "--models takes qwen3,qwen3_moe"),
        (["--max-tokens", "4", "--configs", "vllm-eager"], "--max-tokens takes an integer >= 1 and no vllm-* config"),
    ],
)
def test_bad_arguments_are_named(script, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        script.parse(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_failed_and_unavailable_configs_are_rows_not_crashes(script):
    """A config that could not start is a row with its reason; ratios only against vLLM configs that ran."""
    ok = {"seconds": [2.0], "rates": [100.0], "init_s": 1.0, "load": [0.5], "torch_threads": 2, "tokens": [[1, 2], [3]]}
    other = {**ok, "rates": [50.0], "tokens": [[1, 2], [4]]}
    configs = [
        script.Config("hetero-torch", "hetero", "torch"),
        script.Config("vllm-eager", "vllm"),
        script.Config("vllm-compiled", "vllm", compiled=True),
        script.Config("hf-batched", "hf"),
    ]
    runs = {
        "hetero-torch": [ok, ok],
        "vllm-eager": [other],
        "vllm-compiled": [{"unavailable": "no vLLM"}],
        "hf-batched": [{"failed": "rc 1: boom"}],
    }
    from _engine_report import model_rows, verdict

    rows = {r["name"]: r for r in model_rows("qwen3", configs, runs)}
    assert rows["hetero-torch"]["identical"] == 1 and rows["hetero-torch"]["reference"] == "vllm-eager"
    assert rows["hetero-torch"]["x_vllm-eager"] == 2.0 and "x_vllm-compiled" not in rows["hetero-torch"]
    assert rows["vllm-compiled"]["status"] == "unavailable" and rows["hf-batched"]["status"] == "FAILED"
    assert "hetero-torch 100 tok/s = 2.00x vllm-eager" in verdict(list(rows.values()), "qwen3")
