"""End to end: vLLM with hetero-vllm gives stock vLLM-CPU's greedy tokens, and hetero served every routed layer.

Every engine run is a subprocess (see conftest). The workload (``_driver.py``) has
prompts over several KV blocks, chunked prefill and a prefix-cache hit.
"""

from __future__ import annotations

import importlib.util

import pytest
from _compare import DENSE_ROUTES, LLAMA_ROUTES, MOE_ROUTES, assert_compiled, assert_routed, assert_same_generation


def test_dense_eager_matches_stock(models, runs):
    stock, _ = runs(models["qwen3"])
    got, report = runs(models["qwen3"], backend="cpu_ref")
    assert_same_generation(got, stock)
    assert_routed(report, DENSE_ROUTES)
    assert "VocabParallelEmbedding" in report["not_routed"]  # built, and kept on vLLM's path
    assert "MRotaryEmbedding" not in report["not_routed"]  # never built in this model


def test_llama_eager_matches_stock(models, runs):
    stock, _ = runs(models["llama"])
    got, report = runs(models["llama"], backend="cpu_ref")
    assert_same_generation(got, stock)
    assert_routed(report, LLAMA_ROUTES)
    assert "RotaryEmbedding" not in report["routed"]


def test_dense_eager_matches_float64_transformers(models, runs):
    """Independent of vLLM's kernels: hetero's logprobs are those of transformers in float64."""
    import _driver
    import torch
    from transformers import AutoModelForCausalLM

    got, _ = runs(models["qwen3"], backend="cpu_ref")
    model = AutoModelForCausalLM.from_pretrained(models["qwen3"], dtype=torch.float64)
    first, second = _driver.prompts(model.config.vocab_size)
    for prompt, seq in zip(first + second, got):
        ids = torch.tensor([prompt + seq["tokens"]])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(ids).logits[0, len(prompt) - 1 : -1], dim=-1)
        for step, top in enumerate(seq["logprobs"]):
            for token, value in top.items():
                assert abs(float(logprobs[step, int(token)]) - value) <= 1e-5, (step, token)


def test_dense_compiled_matches_stock(models, runs, tmp_path_factory):
    """vLLM's compiled mode (Dynamo + Inductor) still calls hetero: the ops are opaque custom ops, forced on.
    The compile cache is on and shared, stock run first: a routed run must never load the stock graph."""
    env = {"VLLM_CACHE_ROOT": str(tmp_path_factory.mktemp("vllm-cache"))}
    stock, _ = runs(models["qwen3"], compiled=True, env=env)
    got, report = runs(models["qwen3"], backend="cpu_ref", compiled=True, env=env)
    assert_compiled(report)
    assert_same_generation(got, stock)
    assert_routed(report, DENSE_ROUTES)


def test_moe_eager_matches_stock(models, runs):
    stock, _ = runs(models["qwen3_moe"])
    got, report = runs(models["qwen3_moe"], backend="cpu_ref")
    assert_same_generation(got, stock)
    assert_routed(report, MOE_ROUTES)


def test_moe_compiled_matches_stock(models, runs):
    """Compiled Qwen3-MoE: the fused-MoE method stays on hetero under Dynamo + Inductor (weights not repacked)."""
    env = {"VLLM_DISABLE_COMPILE_CACHE": "1"}
    stock, _ = runs(models["qwen3_moe"], compiled=True, env=env)
    got, report = runs(models["qwen3_moe"], backend="cpu_ref", compiled=True, env=env)
    assert_compiled(report)
    assert_same_generation(got, stock)
    assert_routed(report, MOE_ROUTES)


def test_sliding_window_and_softcap_match_stock(models, runs):
    """Gemma2: a 48-key window on one layer (prompts run past it) and a logit softcap, through hetero attention."""
    stock, _ = runs(models["gemma2"])
    got, report = runs(models["gemma2"], backend="cpu_ref")
    assert_same_generation(got, stock)
    assert_routed(report, {"Attention": {"write_kv", "paged_attention"}, "RotaryEmbedding": {"rotary_embedding"}})
    assert {"GemmaRMSNorm", "GeluAndMul"} <= report["not_routed"].keys()


def test_multiprocess_workers_load_the_plugin(models, runs):
    """Default V1 multiprocessing: the model runs in the engine-core process, whose report shows the calls."""
    stock, _ = runs(models["qwen3"])
    got, report = runs(models["qwen3"], backend="cpu_ref", multiprocess=True)
    assert_same_generation(got, stock)
    assert_routed(report, DENSE_ROUTES)
    busy = [w for w in report["writers"] if w["calls"] > 0]
    assert busy and all(w["pid"] != report["driver_pid"] for w in busy), report["writers"]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed in this venv")
def test_cuda_backend_under_the_triton_interpreter(models, runs):
    """hetero's cuda backend (Triton kernels, run by the interpreter on CPU) inside vLLM."""
    stock, _ = runs(models["qwen3"])
    got, report = runs(models["qwen3"], backend="cuda", env={"HETERO_TRITON_INTERPRET": "1"})
    assert_same_generation(got, stock)
    assert_routed(report, DENSE_ROUTES, backend="cuda")
