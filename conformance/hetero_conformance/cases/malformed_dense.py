"""Malformed calls of the GEMMs and the layer glue (normalization, rotary embedding, gated activation)."""

from __future__ import annotations

import torch

from hetero_conformance.cases._malformed import Draw, Malformed, put, swap

__all__ = ["calls"]

M, K, N, G = 7, 128, 48, 4
HIDDEN, MAX_POS, HEAD = 256, 64, 64


def _gemm(d: Draw) -> dict:
    return {"a": d.randn(M, K), "b": d.randn(N, K), "bias": d.randn(N)}


def _scaled(d: Draw) -> dict:
    fp8 = torch.float8_e4m3fn
    return {
        "a": d.randn(M, K, dtype=fp8),
        "b": d.randn(N, K, dtype=fp8),
        "a_scale": d.uniform(0.5, 1.5, M, 1),
        "b_scale": d.uniform(0.5, 1.5, N, 1),
    }


def _grouped(d: Draw) -> dict:
    # 10 rows in 4 groups, one of them empty
    return {"a": d.randn(10, K), "b": d.randn(G, N, K), "group_ends": d.tensor([3, 3, 7, 10])}


def _rms(d: Draw) -> dict:
    return {"x": d.randn(5, HIDDEN), "weight": d.randn(HIDDEN), "eps": 1e-6, "residual": d.randn(5, HIDDEN)}


def _rotary(d: Draw) -> dict:
    return {
        "positions": d.ints(MAX_POS, 5, dtype=torch.int64),
        "q": d.randn(5, 4, HEAD),
        "k": d.randn(5, 2, HEAD),
        "cos_sin_cache": d.uniform(-1.0, 1.0, MAX_POS, HEAD),
    }


def _silu(d: Draw) -> dict:
    return {"x": d.randn(5, 2 * HIDDEN)}


def _gemm_calls() -> list[Malformed]:
    g, s, gg = "gemm", "scaled_gemm", "grouped_gemm"
    return [
        Malformed(g, "inner_dim_mismatch", _gemm, swap("b", lambda b, d: d.randn(N, K // 2)), "b"),
        Malformed(g, "dtype_mismatch", _gemm, swap("b", lambda b, d: b.to(torch.float16)), "b"),
        Malformed(g, "a_wrong_rank", _gemm, swap("a", lambda a, d: a.reshape(1, M, K)), "a"),
        Malformed(g, "bias_wrong_size", _gemm, swap("bias", lambda b, d: d.randn(N - 1)), "bias"),
        Malformed(
            s, "a_scale_wrong_shape", _scaled, swap("a_scale", lambda x, d: d.uniform(0.5, 1.5, 3, 1)), "a_scale"
        ),
        Malformed(s, "b_scale_bfloat16", _scaled, swap("b_scale", lambda x, d: x.to(torch.bfloat16)), "b_scale"),
        Malformed(s, "operands_not_quantized", _scaled, lambda a, d: a.update(a=d.randn(M, K), b=d.randn(N, K)), "a"),
        Malformed(gg, "group_ends_decreasing", _grouped, put("group_ends", 2, 2), "group_ends", index=True),
        Malformed(gg, "group_ends_past_M", _grouped, put("group_ends", 3, 11), "group_ends", index=True),
        Malformed(gg, "group_ends_negative", _grouped, put("group_ends", 0, -1), "group_ends", index=True),
        Malformed(
            gg, "group_ends_wrong_length", _grouped, swap("group_ends", lambda t, d: t[:-1].clone()), "group_ends"
        ),
        Malformed(gg, "weight_inner_dim_mismatch", _grouped, swap("b", lambda b, d: d.randn(G, N, K // 2)), "b"),
    ]


def _layer_calls() -> list[Malformed]:
    n, r, s = "rms_norm", "rotary_embedding", "silu_and_mul"
    return [
        Malformed(n, "weight_wrong_size", _rms, swap("weight", lambda w, d: d.randn(HIDDEN - 1)), "weight"),
        Malformed(n, "eps_negative", _rms, swap("eps", lambda e, d: -1e-6), "eps"),
        Malformed(
            n, "residual_shape_mismatch", _rms, swap("residual", lambda x, d: d.randn(5, HIDDEN // 2)), "residual"
        ),
        Malformed(r, "position_past_cache", _rotary, put("positions", 2, MAX_POS), "positions", index=True),
        Malformed(r, "position_negative", _rotary, put("positions", 0, -1), "positions", index=True),
        Malformed(r, "positions_int32", _rotary, swap("positions", lambda p, d: p.to(torch.int32)), "positions"),
        Malformed(
            r,
            "cache_odd_rotary_dim",
            _rotary,
            swap("cos_sin_cache", lambda c, d: d.uniform(-1.0, 1.0, MAX_POS, HEAD - 1)),
            "cos_sin_cache",
        ),
        Malformed(r, "is_neox_not_bool", _rotary, swap("is_neox", lambda v, d: "yes"), "is_neox"),
        Malformed(s, "odd_last_dim", _silu, swap("x", lambda x, d: d.randn(5, 2 * HIDDEN - 1)), "x"),
        Malformed(s, "integer_input", _silu, swap("x", lambda x, d: d.ints(100, 5, 2 * HIDDEN) + 1), "x"),
    ]


def calls() -> list[Malformed]:
    """The gemm and layers families' malformed calls."""
    return _gemm_calls() + _layer_calls()
