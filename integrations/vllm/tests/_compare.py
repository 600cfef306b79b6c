"""Comparing two runs of ``_driver.py`` (identical greedy tokens, top-k logprobs within a tolerance) and reading
the routing report (every routed class served by hetero)."""

from __future__ import annotations

from typing import Any

__all__ = [
    "DENSE_ROUTES",
    "EXPERT_ROUTES",
    "LINEAR_ROUTES",
    "LLAMA_ROUTES",
    "MOE_ROUTES",
    "assert_compiled",
    "assert_routed",
    "assert_same_generation",
]


def assert_same_generation(got: list[dict[str, Any]], want: list[dict[str, Any]], atol: float = 1e-5) -> float:
    """Raise AssertionError at the first differing token or logprob; returns the largest |logprob difference|."""
    assert len(got) == len(want), f"{len(got)} sequences, expected {len(want)}"
    worst = 0.0
    for i, (g, w) in enumerate(zip(got, want)):
        assert g["tokens"] == w["tokens"], f"sequence {i}: tokens {g['tokens']} != stock {w['tokens']}"
        for step, (gl, wl) in enumerate(zip(g["logprobs"], w["logprobs"])):
            assert gl.keys() == wl.keys(), f"sequence {i} step {step}: top-k ids {sorted(gl)} != stock {sorted(wl)}"
            for token, value in wl.items():
                diff = abs(gl[token] - value)
                assert diff <= atol, f"sequence {i} step {step} token {token}: logprob {gl[token]} vs stock {value}"
                worst = max(worst, diff)
    return worst


#: The vLLM classes hetero must have served in a dense Qwen3, and the hetero ops each one used.
DENSE_ROUTES = {
    "QKVParallelLinear": {"gemm"},
    "MergedColumnParallelLinear": {"gemm"},
    "RowParallelLinear": {"gemm"},
    "ParallelLMHead": {"gemm"},
    "RMSNorm": {"rms_norm", "rms_norm+residual"},
    "SiluAndMul": {"silu_and_mul"},
    "RotaryEmbedding": {"rotary_embedding"},
    "Attention": {"write_kv", "paged_attention"},
}
LLAMA_ROUTES = {
    **{k: v for k, v in DENSE_ROUTES.items() if k != "RotaryEmbedding"},
    "Llama3RotaryEmbedding": {"rotary_embedding"},
}  # a rope subclass, routed under its own name
#: The linear layers every tested model has (attention output, MLP or shared expert, LM head), and its experts.
LINEAR_ROUTES = {"RowParallelLinear": {"gemm"}, "MergedColumnParallelLinear": {"gemm"}, "ParallelLMHead": {"gemm"}}
EXPERT_ROUTES = {"UnquantizedFusedMoEMethod": {"fused_moe"}}
MOE_ROUTES = {
    **{k: v for k, v in DENSE_ROUTES.items() if k not in ("SiluAndMul", "MergedColumnParallelLinear")},
    "UnquantizedFusedMoEMethod": {"fused_moe"},
}


def assert_compiled(report: dict) -> None:
    """The run really compiled: vLLM turns compilation off by itself for some architectures
    (``VLLM_USE_BREAKABLE_CUDAGRAPH``), which would make a "compiled" test an eager one."""
    assert report["driver_compilation"] != "NONE", "vLLM ran this 'compiled' run eagerly"


def assert_routed(report: dict, expected: dict[str, set[str]], backend: str = "cpu_ref") -> None:
    """Every expected class shows each of its hetero ops with calls > 0, and every instance of it that vLLM built
    called hetero (a silent bypass fails here)."""
    assert report["backend"] == backend
    for cls, ops in expected.items():
        calls = report["routed"].get(cls, {})
        assert ops <= calls.keys(), f"{cls}: hetero ops {sorted(calls)} served it, expected {sorted(ops)}"
        assert all(calls[op] > 0 for op in ops), f"{cls}: {calls}"
        built = report["instances"].get(cls, {"built": 0, "called": 0})
        assert built["called"] == built["built"] > 0, f"{cls}: {built} (every built instance calls hetero)"
