"""Tensor parallelism of 2 and 4 over gloo: every prompt's logits at every position match transformers.

Tokens alone can hide an error that does not flip an argmax; logits cannot. The
tiny models have 4 query heads and 2 KV heads, so at TP=4 each rank holds one
query head and a replica of the KV head its query head reads (KV head r // 2 on
rank r), and at TP=2 each rank holds one KV head of its own. Qwen3 with
``attention_bias=True`` has a bias on o_proj, a row-parallel layer: it must be
added once, after the all-reduce. Qwen2 has q/k/v biases (column-parallel, the
k/v ones replicated with their heads at TP=4) and no o_proj bias.

One torchrun launch of 4 processes runs all four jobs (TP=4 on the whole world,
TP=2 on the pairs of ranks), float32 on cpu_ref, same tolerance as the
single-process logits tests (``test_qwen_models.py``): ||a - b|| / ||b|| < 1e-4.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from _hf import hf_model, prompts

from hetero.distributed import free_port
from hetero.tools import tiny

WORKER = Path(__file__).with_name("_logits_worker.py")
TOL = 1e-4
PROMPT_LENS = (7, 1, 20)

#: name -> (tiny arch, config overrides)
MODELS = {"qwen3_attention_bias": ("qwen3", dict(attention_bias=True)), "qwen2": ("qwen2", {})}
JOBS = [(name, tp) for tp in (4, 2) for name in MODELS]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """(checkpoint dirs, prompts, job name -> what rank 0 of its group saved), from one torchrun launch."""
    root = tmp_path_factory.mktemp("tp_logits")
    dirs = {
        name: tiny.build(arch, root / name, shard_size=None, **overrides) for name, (arch, overrides) in MODELS.items()
    }
    ps = prompts(256, PROMPT_LENS, seed=5)
    jobs = [{"name": f"{name}_tp{tp}", "model": str(dirs[name]), "tp": tp, "prompts": ps} for name, tp in JOBS]
    (root / "jobs.json").write_text(json.dumps(jobs))
    out = root / "out"
    out.mkdir()
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "4",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        str(WORKER),
        str(root / "jobs.json"),
        str(out),
    ]
    run = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    saved = {j["name"]: torch.load(out / f"{j['name']}.pt") for j in jobs}
    return dirs, ps, saved


@torch.inference_mode()
def hf_logits(model_dir: Path, ps: list[list[int]]) -> list[torch.Tensor]:
    model = hf_model(str(model_dir))
    return [model(torch.tensor([p])).logits[0].float() for p in ps]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("name,tp", JOBS, ids=[f"{n}-tp{tp}" for n, tp in JOBS])
def test_tp_logits_match_transformers(launched, name, tp):
    dirs, ps, saved = launched
    got = saved[f"{name}_tp{tp}"]
    assert got["tp"] == tp
    for n, ours, want in zip(PROMPT_LENS, got["logits"], hf_logits(dirs[name], ps)):
        assert ours.shape == want.shape
        err = rel(ours, want)
        assert err < TOL, f"{name} TP={tp}, prompt of {n} tokens: logits rel error {err:.2e}"


def test_the_models_exercise_row_parallel_bias_and_kv_head_replication(launched):
    """What the logits tests claim to cover is really there on the ranks."""
    _, _, saved = launched
    for tp in (2, 4):
        assert saved[f"qwen3_attention_bias_tp{tp}"]["o_proj_bias"] is True
        assert saved[f"qwen2_tp{tp}"]["o_proj_bias"] is False
    for name in MODELS:
        assert saved[f"{name}_tp4"]["kv_heads"] == 2 and saved[f"{name}_tp4"]["local_kv_heads"] == 1  # replicated
        assert saved[f"{name}_tp2"]["kv_heads"] == 2 and saved[f"{name}_tp2"]["local_kv_heads"] == 1  # split
