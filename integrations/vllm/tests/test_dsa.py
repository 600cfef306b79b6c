"""DeepSeek-V3.2 sparse attention (DSA) through vLLM on hetero's platform: indexer, top-k and sparse MLA.

vLLM-CPU has no DSA of its own (its CPU platform refuses sparse attention), so the reference is transformers
in float64, teacher-forced on vLLM's tokens. The tiny checkpoint's ``index_topk`` (6) is below every prompt's
length, so the indexer's choice changes the tokens (checked against the same model with the top-k off).
"""

from __future__ import annotations

import pytest

DSA_ROUTES = {
    "MLAAttention": {"write_mla_kv", "mla_attention"},
    "SparseAttnIndexer": {"write_index_k", "indexer_topk"},
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


def test_dsa_eager_matches_float64_transformers(dsa_model, runs):
    """Greedy tokens are transformers' argmax at every step and the top-k logprobs agree to 1e-5; every sparse
    MLA layer and indexer vLLM built called hetero."""
    import _driver
    from _compare import assert_routed

    got, report = runs(dsa_model, backend="cpu_ref", platform=True)
    assert report["driver_platform"] == "hetero_vllm._cpu_platform.HeteroCpuPlatform"
    assert_routed(report, DSA_ROUTES)
    model = _reference(dsa_model)
    first, second = _driver.prompts(model.config.vocab_size)
    assert len(got) == len(first + second)
    for i, (prompt, seq) in enumerate(zip(first + second, got)):
        logprobs = _logprobs(model, prompt, seq["tokens"])
        assert logprobs.argmax(-1).tolist() == seq["tokens"], f"sequence {i}: greedy tokens differ"
        for step, top in enumerate(seq["logprobs"]):
            for token, value in top.items():
                assert abs(float(logprobs[step, int(token)]) - value) <= 1e-5, (i, step, token)


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
