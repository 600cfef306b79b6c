"""Tensor and expert parallelism over gloo, launched by torchrun: the same tokens as one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _hf import hf_greedy, prompts

from hetero.distributed import free_port

WORKER = Path(__file__).with_name("_parallel_worker.py")
MAX_TOKENS = 8


def _torchrun(jobs: list[dict], tmp_path: Path, env: dict[str, str] | None = None) -> list[list[list[int]]]:
    jobs_path, out_path = tmp_path / "jobs.json", tmp_path / "out.json"
    jobs_path.write_text(json.dumps(jobs))
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
        str(WORKER),
        str(jobs_path),
        str(out_path),
    ]
    run = subprocess.run(
        cmd, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-4000:]
    got = json.loads(out_path.read_text())
    assert json.loads(Path(f"{out_path}.1").read_text()) == got, "rank 1 returned other outputs than rank 0"
    return got


def _jobs(checkpoints, backend: str, plan: list[tuple[str, bool]]) -> tuple[list[dict], list[list[list[int]]]]:
    ps = prompts(256, (6, 13, 29), seed=3)
    jobs, want = [], []
    for arch, ep in plan:
        path = str(checkpoints(arch))
        jobs.append({"model": path, "backend": backend, "tp": 2, "ep": ep, "prompts": ps, "max_tokens": MAX_TOKENS})
        want.append(hf_greedy(path, ps, MAX_TOKENS))
    return jobs, want


def test_tp2_and_ep2_on_cpu_ref(checkpoints, tmp_path):
    plan = [(a, False) for a in ("qwen2", "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3")]
    plan += [(a, True) for a in ("qwen3_moe", "deepseek_v2", "deepseek_v3")]
    # hybrid models: Gated DeltaNet heads, conv channels and state split over the ranks
    plan += [(a, False) for a in ("qwen3_next", "qwen3_5", "qwen3_5_moe")] + [("qwen3_next", True)]
    plan += [("kimi_linear", False), ("kimi_linear", True)]  # KDA heads and states, NoPE MLA, V3 experts
    plan += [(a, ep) for a in ("glm4_moe", "ernie4_5_moe") for ep in (False, True)]  # biases, shared experts
    # MiniMax-M2's q/k norm over all heads (a sum of squares over the ranks); MiMo's sliding/full layers
    plan += [(a, ep) for a in ("minimax_m2", "mimo_v2_flash") for ep in (False, True)]
    jobs, want = _jobs(checkpoints, "cpu_ref", plan)
    jobs[1]["stray"] = True  # a request only rank 1 sees: rank 0 schedules, so the ranks cannot diverge
    # speculative decoding: drafting and verification on both ranks, rank 0's verdicts broadcast
    for i, spec in ((1, {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}), (7, "self")):
        if spec == "self":
            spec = {"method": "draft_model", "model": jobs[i]["model"], "num_speculative_tokens": 2}
        jobs.append(dict(jobs[i], spec=spec, stray=False))
        want.append(want[i])
        plan.append((plan[i][0] + f" with {spec['method']}", plan[i][1]))
    got = _torchrun(jobs, tmp_path)
    for (arch, ep), g, w in zip(plan, got, want):
        assert g == w, f"{arch} {'EP' if ep else 'TP'}=2 differs from transformers"


def test_tp2_and_ep2_on_the_triton_kernels(checkpoints, tmp_path):
    pytest.importorskip("triton")
    plan = [("qwen3", False), ("deepseek_v3", True)]
    jobs, want = _jobs(checkpoints, "cuda", plan)
    got = _torchrun(jobs, tmp_path, env={"HETERO_TRITON_INTERPRET": "1", "TRITON_INTERPRET": "1"})
    assert got == want


def test_quantized_checkpoints_under_tp2_and_ep2(tmp_path):
    """8-bit and W4A16 checkpoints split over two ranks (per-channel scales cut with their rows, int4 groups at
    their boundaries; EP's experts through quantize_activation + scaled_grouped_gemm, or the int4 grouped_gemm):
    every greedy token is in the (fake-quantized) oracle's top-5 given the engine's own prefix, vLLM's
    acceptance rule (a rank split may flip an 8-bit rounding)."""
    from _quant_oracle import PROMPTS, checkpoints, hf_logits, hf_model

    plan = [("qwen3_moe", "fp8-channel", False), ("qwen3_moe", "fp8-channel", True), ("qwen3", "int8-channel", False)]
    # W4A16 (issue 35): int4 groups of 32 with zero points, K cut at group boundaries; EP's grouped_gemm
    plan += [("qwen3_moe", "w4a16-g32-asym", False), ("qwen3_moe", "w4a16-g32-asym", True)]
    jobs, oracles = [], []
    for i, (arch, scheme, ep) in enumerate(plan):
        q = checkpoints(arch, scheme, tmp_path / str(i))[1]
        jobs.append({"model": str(q), "backend": "cpu_ref", "tp": 2, "ep": ep, "prompts": PROMPTS[:2], "max_tokens": 5})
        oracles.append((hf_model(tmp_path / str(i) / "deq"), scheme))
    got = _torchrun(jobs, tmp_path)
    for (arch, scheme, ep), (hf, _), outs in zip(plan, oracles, got):
        for p, out in zip(PROMPTS[:2], outs):
            logits = hf_logits(hf, [list(p) + out], scheme)[0]
            for i, token in enumerate(out):
                top = logits[len(p) - 1 + i].topk(5).indices.tolist()
                assert token in top, (arch, scheme, "EP" if ep else "TP", p, i, token, top)
