"""DeepSeek-V3.2 and GLM-5 (DeepSeek Sparse Attention) against transformers 5.24's own classes on tiny random
checkpoints (``hetero.tools.tiny``: 16 index heads, index_topk 6, far below the longer prompts), on cpu_ref in
float32: packed prefill logits and every layer's output, greedy tokens, batching with chunked prefill and prefix
caching, preemption, check-model, and TP=2 of all three new families (gpt-oss included) over gloo.

GLM-5's tiny checkpoint has ``indexer_types = [full, shared, full]``: layer 1 has no indexer and attends to the
keys layer 0 selected.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from _hf import hf_greedy, prompts
from test_qwen_models import PROMPT_LENS, assert_small, errors

import hetero
from hetero.engine.forward import build_model

ARCHS = ("deepseek_v32", "glm_moe_dsa")


@pytest.fixture(scope="module")
def ops():
    return hetero.load("cpu_ref")


@pytest.fixture(scope="module")
def prompt_ids():
    return prompts(256, PROMPT_LENS)


@pytest.fixture(scope="module")
def models(checkpoints, ops):
    """arch -> hetero's model of the tiny checkpoint, built once per module."""
    built = {}

    def get(arch):
        if arch not in built:
            built[arch] = build_model(checkpoints(arch), ops, torch.float32)
        return built[arch]

    return get


def _llm(path, backend="cpu_ref", **kw):
    from hetero.engine import LLM

    return LLM(str(path), backend=backend, dtype="float32", **kw)


def _greedy(llm, prompt_ids, max_tokens):
    from hetero.engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [list(o.token_ids) for o in llm.generate(prompt_ids, params, progress=False)]


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_and_every_layer_match_transformers(arch, checkpoints, models, prompt_ids):
    model = models(arch)
    assert type(model).__name__ == model.config.architectures[0]
    assert_small(errors(model, checkpoints(arch), prompt_ids))


def test_structure_follows_config(models):
    from hetero.engine.layers.dsa import SparseMLAttention
    from hetero.engine.models.decoder import GatedMLP
    from hetero.engine.models.deepseek import DeepseekMoE

    v32, glm = models("deepseek_v32").model.layers, models("glm_moe_dsa").model.layers
    assert all(isinstance(x.self_attn, SparseMLAttention) for x in [*v32, *glm])
    assert [x.self_attn.indexer is not None for x in v32] == [True, True, True]
    assert [x.self_attn.indexer is not None for x in glm] == [True, False, True]
    assert [type(x.mlp) for x in v32] == [GatedMLP, DeepseekMoE, DeepseekMoE]  # mlp_layer_types
    indexer = v32[0].self_attn.indexer
    assert indexer.rotary.is_neox and not glm[0].self_attn.indexer.rotary.is_neox
    assert not v32[0].self_attn.rotary.is_neox and not glm[0].self_attn.rotary.is_neox  # MLA's own rope: interleaved
    assert {e.name: e.shape for e in indexer.cache_spec()} == {"index_cache": (16,)}
    assert [e.name for e in glm[1].self_attn.cache_spec()] == ["ckv_cache", "kpe_cache"]
    assert indexer.weights_proj.weight.dtype == torch.float32 and indexer.topk == 6
    assert indexer.weight_scale == pytest.approx(16**-0.5 * 16**-0.5)


@pytest.mark.parametrize("change", ["dense", "rope_style", "no_sharing"])
def test_the_comparison_can_fail(change, checkpoints, models, prompt_ids, monkeypatch):
    """Attending to every key (no pruning), the other indexer rope style, or GLM-5's shared layer running an
    indexer of its own (layer 2's, on its own input) each move the logits far past the tolerance."""
    arch = "glm_moe_dsa" if change == "no_sharing" else "deepseek_v32"
    model = models(arch)
    layers = model.model.layers
    if change == "dense":
        for x in layers:
            monkeypatch.setattr(x.self_attn.indexer, "topk", 10_000)
    elif change == "rope_style":
        for x in layers:
            monkeypatch.setattr(x.self_attn.indexer.rotary, "is_neox", False)
    else:
        monkeypatch.setattr(layers[1].self_attn, "indexer", layers[2].self_attn.indexer)
    for n, (logit_err, _) in zip(PROMPT_LENS, errors(model, checkpoints(arch), prompt_ids)):
        assert n <= 6 or logit_err > 1e-3, (n, logit_err)  # up to index_topk tokens every key is selected


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tokens_equal_transformers(arch, checkpoints):
    path = checkpoints(arch)
    ps = prompts(256, (5, 17, 40))
    assert _greedy(_llm(path), ps, 32) == hf_greedy(path, ps, 32)


def test_sixteen_requests_chunked_cached_and_preempted_equal_one_at_a_time(checkpoints):
    """GLM-5's tiny model (full and shared layers; V3.2 differs only in its indexer's rope)."""
    path = checkpoints("glm_moe_dsa")
    ps = prompts(256, [3 + 5 * i for i in range(16)], seed=1)
    ps[9] = ps[7][:24] + ps[9]  # three shared blocks of 8: the prefix cache serves them, index keys included
    alone = _greedy(_llm(path, max_num_seqs=1, enable_prefix_caching=False), ps, 8)
    together = _llm(path, max_num_seqs=16, block_size=8, max_num_batched_tokens=64)
    assert _greedy(together, ps, 8) == alone
    assert max(together.stats["step_tokens"]) == 64 and together.stats["cached_prompt_tokens"] >= 16
    small = _llm(path, max_num_seqs=16, block_size=8, num_kv_blocks=14, max_num_batched_tokens=64)
    assert _greedy(small, ps, 8) == alone
    assert small.stats["preemptions"] > 0
    assert alone == hf_greedy(path, ps, 8)


@pytest.mark.parametrize("arch", ARCHS)
def test_check_model_passes(arch, checkpoints):
    from hetero.tools.check import ModelCheck

    report = ModelCheck(checkpoints(arch), "cpu_ref").run(prompts(256, (7, 19)), max_tokens=4)
    assert report.passed, report.as_dict()
    assert [r.name for r in report.layers][1:4] == [f"layer {i}" for i in range(3)]
    assert max(r.rel_l2 for r in report.layers) < 1e-5


def test_tp2_equals_transformers(checkpoints, tmp_path):
    """The indexer is replicated (every rank selects the same keys); gpt-oss splits its sinks with the heads and
    adds its row-parallel biases once. Also EP=2 of DeepSeek-V3.2's experts."""
    from test_parallel import _jobs, _torchrun

    plan = [(arch, False) for arch in (*ARCHS, "gpt_oss")] + [("deepseek_v32", True)]
    jobs, want = _jobs(checkpoints, "cpu_ref", plan)
    for (arch, ep), got, expected in zip(plan, _torchrun(jobs, tmp_path), want):
        assert got == expected, f"{arch} {'EP' if ep else 'TP'}=2 differs from transformers"


@pytest.mark.parametrize("arch", ["deepseek_v32", "glm_moe_dsa", "gpt_oss"])
def test_triton_kernels_under_the_interpreter(arch, checkpoints, triton_interpreter):
    """The cuda backend's indexer, sparse MLA, layer_norm, sink-attention and swigluoai MoE kernels inside the
    engine (Triton interpreter)."""
    from _hf import hf_model

    from hetero.engine.forward import prefill

    cuda = hetero.load("cuda")
    needed = (
        ("indexer_topk", "write_index_k", "mla_attention", "layer_norm")
        if arch != "gpt_oss"
        else ("paged_attention", "fused_moe")
    )
    assert all(cuda.explain()[op].origin == "backend" for op in needed), {op: cuda.explain()[op] for op in needed}
    path = checkpoints(arch)
    ps = prompts(256, (4, 11, 23), seed=2)
    for p, got in zip(ps, prefill(build_model(path, cuda, torch.float32), ps, block_size=8).logits):
        with torch.inference_mode():
            want = hf_model(str(path))(torch.tensor([p])).logits[0]
        assert float((got - want).norm() / want.norm()) < 1e-4
    declined = {op: cuda.explain()[op].reasons for op in needed if cuda.explain()[op].reasons}
    assert not declined, declined  # every layer's static configuration was served by the kernels
    if arch == "glm_moe_dsa":  # its engine run (batching, preemption) is deepseek_v32's through the same kernels
        return
    llm = _llm(path, backend="cuda", max_num_seqs=4, block_size=8, num_kv_blocks=7)
    assert _greedy(llm, ps, 8) == hf_greedy(path, ps, 8)
    assert llm.stats["preemptions"] > 0
