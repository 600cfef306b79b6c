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


def test_bf16_agreement_is_the_first_token_and_the_top5_rule(script):
    from _engine_report import agreement

    ref = [[5, 6, 7], [5, 6, 7], [5, 6, 7], [1, 2]]
    top5 = [[[5, 9], [6, 8], [7, 4]]] * 3 + [[[1, 3], [2, 4]]]
    got = [
        [5, 6, 7],  # identical
        [5, 6, 4],  # differs at 2, where 4 is among the reference's top-5: kept
        [5, 3, 7],  # differs at 1, where 3 is not: broken
        [3, 2],  # differs at 0 (first token), where 3 is among the top-5: kept
    ]
    assert agreement(got, ref, top5) == {"first_token": 3, "top5": 3, "sampled": 4}
    assert agreement(got[:2], ref, top5[:2])["sampled"] == 2  # only the requests the reference has top-5 ids for


def test_decode_roofline_by_hand(tmp_path):
    """Dense: every weight and the KV cache read once a step; MoE: only the experts the batch routes to."""
    from transformers import Qwen3Config, Qwen3MoeConfig

    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from _workloads import decode_roofline
    finally:
        sys.path.remove(str(SCRIPT.parent))
    arch = dict(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    Qwen3Config(**arch, head_dim=16, intermediate_size=128, dtype="bfloat16").save_pretrained(tmp_path / "d")
    ceilings = {"tflops": {"bfloat16": 1e-3, "float32": 1e-3}, "tb_s": 1e-3}  # 1 GFLOP/s, 1 GB/s
    attn = 64 * 16 * (2 * 4 + 2 * 2)
    weights = 2 * (attn + 3 * 64 * 128) + 100 * 64
    kv = 8 * 10 * 2 * 2 * 2 * 16  # batch 8, context 10, 2 layers, K and V, 2 KV heads of 16
    got = decode_roofline(tmp_path / "d", 8, 10, ceilings)
    assert got["step_bytes"] == 2 * (weights + kv)
    assert got["step_flops"] == 2 * 8 * weights + 2 * kv * 2  # 4 query heads per 2 KV heads
    assert got["tok_s"] == pytest.approx(8 / max(got["step_bytes"] / 1e9, got["step_flops"] / 1e9))
    moe = dict(num_experts=16, num_experts_per_tok=2, moe_intermediate_size=32, mlp_only_layers=[])
    Qwen3MoeConfig(**arch, **moe, head_dim=16, dtype="bfloat16").save_pretrained(tmp_path / "m")
    one, many = (decode_roofline(tmp_path / "m", b, 10, ceilings)["step_bytes"] for b in (1, 64))
    expert = 3 * 64 * 32
    assert many - one == 2 * 2 * (16 - 2) * expert + 2 * 2 * (64 - 1) * 10 * 2 * 2 * 16  # all 16 experts, more KV


def test_every_engine_is_given_the_checkpoints_dtype(tmp_path):
    """vLLM's dtype="auto" runs a float32 checkpoint in bf16 on a CPU with bf16 (its float32 numbers were bf16
    ones, its tokens bf16 ones): the workers read the dtype config.json names and pass it explicitly."""
    from transformers import Qwen3Config

    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import _vllm_worker
        from _engine_workers import checkpoint_dtype
    finally:
        sys.path.remove(str(SCRIPT.parent))
    for dtype in ("float32", "bfloat16"):
        Qwen3Config(vocab_size=10, hidden_size=8, dtype=dtype).save_pretrained(tmp_path / dtype)
        assert checkpoint_dtype(str(tmp_path / dtype)) == dtype
    assert "dtype=checkpoint_dtype(model)" in Path(_vllm_worker.__file__).read_text()
