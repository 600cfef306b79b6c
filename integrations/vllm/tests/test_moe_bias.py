"""MoE with expert biases and gpt-oss's ``swigluoai`` through hetero ``fused_moe``: the layout (vLLM's interleaved
gate/up rows, hetero's halves) without an engine, then a tiny gpt-oss end to end against stock vLLM-CPU."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from _compare import assert_routed, assert_same_generation

from hetero_vllm import report

#: Stock vLLM-CPU's float32 MoE and sink attention kernels round differently from cpu_ref (measured: 1.4e-5).
ATOL = 5e-5


def write_gpt_oss(path: Path) -> Path:
    """A tiny gpt-oss (biased experts, swigluoai, sinks, a 4-token sliding window on every other layer).

    head_dim 32: vLLM-CPU's attention (the stock reference) has no kernel for tiny.py's 16. swiglu_limit 7.0:
    vLLM's swigluoai ignores the config's limit and uses 7.0 (its kernels' constant), so the checkpoint says so too.
    """
    from hetero.tools.tiny import build

    return build("gpt_oss", path, shard_size=None, head_dim=32, swiglu_limit=7.0)


@pytest.fixture(scope="module")
def gpt_oss(models) -> Path:
    from conftest import _checkpoint

    return _checkpoint(models.root, write_gpt_oss)


def _moe_config(activation: str, **fields):
    config = dict(
        activation=SimpleNamespace(value=activation),
        is_lora_enabled=False,
        moe_parallel_config=SimpleNamespace(use_ep=False),
        num_local_experts=8,
        num_experts=8,
        has_bias=True,
        swiglu_limit=None,
        swiglu_alpha=None,
    )
    return SimpleNamespace(**{**config, **fields})


def test_biased_silu_and_swigluoai_are_routed_and_tuned_silu_is_not():
    from hetero_vllm.moe import activation_args, unsupported

    assert unsupported(_moe_config("silu")) is None  # has_bias no longer refused
    assert unsupported(_moe_config("swigluoai", swiglu_limit=5.0)) is None
    assert "swiglu_limit" in unsupported(_moe_config("silu", swiglu_limit=5.0))
    assert "gelu" in unsupported(_moe_config("gelu"))
    assert activation_args(_moe_config("swigluoai")) == ("swigluoai", 1.702, 7.0)  # vLLM's constants
    assert activation_args(_moe_config("swigluoai", swiglu_limit=5.0, swiglu_alpha=1.5)) == ("swigluoai", 1.5, 5.0)
    assert activation_args(_moe_config("silu"))[2] is None


def test_deinterleaved_experts_compute_vllms_interleaved_swigluoai(cpu_ref):
    """hetero on the de-interleaved w13 and bias equals the expert MLP on vLLM's interleaved layout, with vLLM's
    own swigluoai (``SwigluOAIAndMul.forward_native``: gate = even rows, up = odd rows)."""
    from vllm.model_executor.layers.activation import SwigluOAIAndMul

    from hetero_vllm.moe import deinterleave

    torch.manual_seed(0)
    experts, inter, hidden, tokens, top_k = 4, 6, 16, 5, 2
    w13, b13 = torch.randn(experts, 2 * inter, hidden), torch.randn(experts, 2 * inter)
    w2, b2 = torch.randn(experts, hidden, inter) * 0.3, torch.randn(experts, hidden)
    x = torch.randn(tokens, hidden)
    weights = torch.rand(tokens, top_k)
    ids = torch.stack([torch.randperm(experts)[:top_k] for _ in range(tokens)]).to(torch.int32)
    vllm_act = SimpleNamespace(alpha=1.702, limit=7.0)  # forward_native reads only these
    want = torch.zeros_like(x)
    for m in range(tokens):
        for s in range(top_k):
            e = ids[m, s]
            h = SwigluOAIAndMul.forward_native(vllm_act, w13[e] @ x[m] + b13[e])
            want[m] += weights[m, s] * (w2[e] @ h + b2[e])
    got = torch.ops.hetero.fused_moe(
        x, deinterleave(w13), w2, weights, ids, "swigluoai", "UnquantizedFusedMoEMethod#0",
        deinterleave(b13), b2, 1.702, 7.0,
    )  # fmt: skip
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert report.snapshot()["routed"]["UnquantizedFusedMoEMethod"] == {"fused_moe": 1}


def test_gpt_oss_biased_experts_match_stock(gpt_oss, runs):
    """gpt-oss's biased swigluoai experts on hetero give stock vLLM-CPU's tokens; every MoE layer called hetero."""
    stock, _ = runs(gpt_oss)
    got, report_ = runs(gpt_oss, backend="cpu_ref")
    assert_same_generation(got, stock, atol=ATOL)
    assert_routed(report_, {"UnquantizedFusedMoEMethod": {"fused_moe"}, "Attention": {"paged_attention"}})
    assert report_["instances"]["UnquantizedFusedMoEMethod"] == {"built": 4, "called": 4}
    assert "UnquantizedFusedMoEMethod" not in report_["not_routed"]
