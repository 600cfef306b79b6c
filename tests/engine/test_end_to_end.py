"""The whole engine against transformers: greedy tokens, batching, preemption, on cpu_ref and the Triton kernels."""

from __future__ import annotations

import pytest
import torch
from _hf import ARCHS, hf_greedy, prompts

LENGTHS = (5, 17, 40)
MAX_TOKENS = 32


def _llm(path, backend="cpu_ref", **kw):
    from hetero.engine import LLM

    return LLM(str(path), backend=backend, dtype="float32", **kw)


def _greedy(llm, prompt_ids, max_tokens=MAX_TOKENS):
    from hetero.engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [list(o.token_ids) for o in llm.generate(prompt_ids, params, progress=False)]


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tokens_equal_transformers(arch, checkpoints):
    path = checkpoints(arch)
    ps = prompts(256, LENGTHS)
    assert _greedy(_llm(path), ps) == hf_greedy(path, ps, MAX_TOKENS)


@pytest.mark.parametrize("arch", ARCHS)
def test_sixteen_requests_together_equal_one_at_a_time_and_survive_preemption(arch, checkpoints):
    """One at a time is transformers' ``generate`` per prompt: an engine run with max_num_seqs=1 would
    repeat that comparison at 16x the steps."""
    path = checkpoints(arch)
    ps = prompts(256, [3 + 5 * i for i in range(16)], seed=1)
    ps[5] = ps[3][:10] + ps[5]  # a shared prefix: the prefix cache serves part of a later request
    together = _greedy(_llm(path, max_num_seqs=16), ps, 12)
    # 14 blocks of 8 tokens hold a few sequences at a time: the scheduler must preempt and recompute
    small = _llm(path, max_num_seqs=16, block_size=8, num_kv_blocks=14, max_num_batched_tokens=64)
    assert _greedy(small, ps, 12) == together
    assert small.stats["preemptions"] > 0 and small.stats["cached_prompt_tokens"] > 0
    assert together == hf_greedy(path, ps, 12)


@pytest.mark.parametrize(
    "arch",
    ["qwen3", "deepseek_v3", "hunyuan_v1_dense", "hunyuan_v1_moe", "hy_v3", "hy_v4", "deepseek_v4", "kimi_linear"]
    + ["glm4_moe", "ernie4_5_moe"]
    + ["minimax_m2", "mimo_v2_flash"],
)
def test_triton_kernels_under_the_interpreter(arch, checkpoints, triton_interpreter):
    """Prefill logits and greedy tokens on the cuda backend's kernels, with no layer's static configuration
    declined; the Hunyuan families' and DeepSeek-V4's batching (preemption, 16 requests) runs the kernels
    qwen3's and deepseek_v3's runs here already batch (and V4's own ops are batched in their kernel tests), so
    they check prefill and a few decode steps."""
    path = checkpoints(arch)
    ps = prompts(256, (4, 11, 23), seed=2)
    from _hf import hf_model

    import hetero
    from hetero.engine.forward import build_model, prefill

    ops = hetero.load("cuda")
    assert ops.device.type == "cpu" and ops.explain()["paged_attention"].origin == "backend"
    logits = prefill(build_model(path, ops, torch.float32), ps, block_size=8).logits
    for p, got in zip(ps, logits):
        with torch.inference_mode():
            want = hf_model(str(path))(torch.tensor([p])).logits[0]
        assert float((got - want).norm() / want.norm()) < 1e-4
    declined = {op: e.reasons for op, e in ops.explain().items() if e.reasons}
    assert not declined, declined  # every layer's static configuration was served by the kernels
    # batching: qwen3's and deepseek_v3's runs; decode only
    if arch.startswith(("hunyuan", "hy_", "deepseek_v4", "kimi", "glm4", "ernie", "minimax", "mimo")):
        assert _greedy(_llm(path, backend="cuda"), ps, 3) == hf_greedy(path, ps, 3)
        return
    # 10 blocks of 8 tokens cannot hold all three sequences at their full length (12 blocks): preemption
    llm = _llm(path, backend="cuda", max_num_seqs=4, block_size=8, num_kv_blocks=10)
    assert _greedy(llm, ps, 16) == hf_greedy(path, ps, 16)
    assert llm.stats["preemptions"] > 0
    # 16 requests of different lengths in one batch, each equal to transformers run alone
    many = prompts(256, [2 + i for i in range(16)], seed=4)
    assert _greedy(_llm(path, backend="cuda", max_num_seqs=16), many, 4) == hf_greedy(path, many, 4)
