"""LLM(compile=True): decode-only steps run through torch.compile of the forward and give the greedy
tokens of eager, dense and MoE, on the torch backend (the one whose ops Dynamo traces)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from hetero.engine import LLM, EngineConfig, SamplingParams
from hetero.engine.runtime import compile_cache
from hetero.engine.runtime.compiled import CompiledForward
from hetero.errors import UsageError

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(3, 200, (2 + 7 * i,), generator=gen).tolist() for i in range(5)]


def run(path: str, compile: bool) -> tuple[list[list[int]], LLM]:
    llm = LLM(path, backend="torch", dtype="float32", block_size=8, max_num_seqs=4, compile=compile)
    return [o.token_ids for o in llm.generate(prompts(), GREEDY, progress=False)], llm


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_compiled_decode_gives_the_tokens_of_eager(checkpoints, arch):
    path = str(checkpoints(arch))
    eager, _ = run(path, compile=False)
    graphs = counters["stats"]["unique_graphs"]
    compiled, llm = run(path, compile=True)
    assert compiled == eager
    forward = llm.runner.forward
    assert isinstance(forward, CompiledForward) and not llm.runner.ops.backend.validate
    # 5 requests over 4 slots: prefill steps ran eager, decode batches of 1 to 4 compiled
    assert forward.compiled_steps > 0 and forward.eager_steps > 0
    # ... on the graphs the start-up warm-up built (batch sizes 1, 2, 4): none was compiled for a request
    assert forward.report["graphs"] >= 1 and counters["stats"]["unique_graphs"] == graphs + forward.report["graphs"]


def test_a_restart_reuses_the_compiled_graphs(checkpoints, tmp_path, monkeypatch):
    """A second engine process on the same model and settings (a server restart) finds Inductor's graphs in
    the first one's keyed cache directory (in one process, torch's in-memory caches would answer instead)."""
    monkeypatch.setenv("HETERO_CACHE_ROOT", str(tmp_path))
    script = (
        "import json, sys; from hetero.engine import LLM; "
        "llm = LLM(sys.argv[1], backend='torch', dtype='float32', block_size=8, max_num_seqs=1, compile=True); "
        "print(json.dumps(llm.runner.forward.report))"
    )
    reports = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", script, str(checkpoints("qwen3"))], capture_output=True, text=True, check=True
        )
        reports.append(json.loads(done.stdout.strip().splitlines()[-1]))
    first, again = reports
    assert Path(first["cache_dir"]).is_relative_to(tmp_path) and first["cache_misses"] >= 1
    assert again["cache_dir"] == first["cache_dir"] and again["graphs"] == first["graphs"]
    assert again["cache_misses"] == 0 and again["cache_hits"] == first["cache_hits"] + first["cache_misses"]


def test_the_cache_key_changes_with_what_shapes_the_graph(tmp_path):
    base = {
        "model_config": {"hidden_size": 64},
        "dtype": "torch.float32",
        "sizes": (8, 4),
        "packages": ["hetero_torch"],
    }
    env = {"HETERO_CACHE_ROOT": str(tmp_path)}
    first = compile_cache.cache_dir(base, 0, env)
    assert first == compile_cache.cache_dir(dict(base), 0, env) and first.is_dir()
    for change in ({"sizes": (16, 4)}, {"dtype": "torch.bfloat16"}, {"model_config": {"hidden_size": 65}}):
        assert compile_cache.cache_dir({**base, **change}, 0, env).parent != first.parent
    assert compile_cache.cache_dir(base, 1, env) == first.parent / "rank1"
    off = compile_cache.cache_dir(base, 0, {**env, "HETERO_COMPILE_CACHE": "0"})
    assert not off.is_relative_to(tmp_path)


def test_only_decode_only_steps_fit():
    from hetero.engine.step_buffers import build_step

    decode = build_step([1, 1], [5, 9], [[0], [1, 2]], 8, "cpu")
    mixed = build_step([1, 4], [5, 9], [[0], [1, 2]], 8, "cpu")
    assert CompiledForward.fits(decode) and not CompiledForward.fits(mixed)


def test_compile_must_be_a_bool(tmp_path):
    with pytest.raises(UsageError, match="compile"):
        EngineConfig(model=str(tmp_path), compile="yes")
