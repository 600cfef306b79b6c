"""Malformed calls of the packed int4 weights (spec 1.9, W4A16) in gemm, grouped_gemm and fused_moe.

The valid calls have an odd K (77 = 2 groups of 32 and a partial one of 13), so a weight with
K / 2 bytes or scales with floor(K / g) groups are defects. Every defect is a shape, dtype, type or
option (always caught): a float weight with int4 options, a packed weight without them, act_quant or
fp8 weights mixed with int4 options.
"""

from __future__ import annotations

import torch

from hetero_conformance.cases._malformed import Draw, Malformed, swap

__all__ = ["calls"]

M, K, N, G, GROUP = 5, 77, 24, 3, 32
KB, KG = (K + 1) // 2, -(-K // GROUP)  # 39 bytes, 3 groups
TOKENS, HIDDEN, E, TOP_K, INTER = 4, 65, 4, 2, 40
U8 = torch.uint8


def _packed(d: Draw, *shape: int) -> torch.Tensor:
    return d.ints(256, *shape, dtype=U8)


def _scales(d: Draw, *shape: int) -> torch.Tensor:
    return d.uniform(0.005, 0.02, *shape)


def _gemm(d: Draw) -> dict:
    return {
        "a": d.randn(M, K),
        "b": _packed(d, N, KB),
        "b_scale": _scales(d, N, KG),
        "b_zero_point": d.ints(16, N, KG, dtype=U8),
        "group_size": GROUP,
        "bias": d.randn(N),
    }


def _grouped(d: Draw) -> dict:
    return {
        "a": d.randn(9, K),
        "b": _packed(d, G, N, KB),
        "group_ends": d.tensor([2, 2, 9]),
        "b_scale": _scales(d, G, N, KG),
        "group_size": GROUP,
    }


def _fused(d: Draw) -> dict:
    hb, hg, ib, ig = (HIDDEN + 1) // 2, -(-HIDDEN // GROUP), INTER // 2, -(-INTER // GROUP)
    return {
        "x": d.randn(TOKENS, HIDDEN),
        "w13": _packed(d, E, 2 * INTER, hb),
        "w2": _packed(d, E, HIDDEN, ib),
        "weights": d.uniform(0.1, 1.0, TOKENS, TOP_K),
        "ids": d.ints(E, TOKENS, TOP_K),
        "w13_scale": _scales(d, E, 2 * INTER, hg),
        "w2_scale": _scales(d, E, HIDDEN, ig),
        "w13_zero_point": d.ints(16, E, 2 * INTER, hg, dtype=U8),
        "group_size": GROUP,
    }


def _set(**options: object):
    return lambda args, d: args.update(options)


def _gemm_calls() -> list[Malformed]:
    g, gg = "gemm", "grouped_gemm"
    return [
        Malformed(g, "int4_no_group_size", _gemm, _set(group_size=None), "group_size"),
        Malformed(g, "int4_group_size_zero", _gemm, _set(group_size=0), "group_size"),
        Malformed(g, "int4_group_size_float", _gemm, _set(group_size=32.0), "group_size"),
        Malformed(g, "int4_no_b_scale", _gemm, _set(b_scale=None), "b_scale"),
        Malformed(g, "int4_b_unpacked", _gemm, swap("b", lambda b, d: _packed(d, N, K)), "b"),
        Malformed(g, "int4_b_floor_half_k", _gemm, swap("b", lambda b, d: b[:, : K // 2].contiguous()), "b"),
        Malformed(
            g, "int4_b_scale_floor_groups", _gemm, swap("b_scale", lambda s, d: s[:, :2].contiguous()), "b_scale"
        ),
        Malformed(g, "int4_b_scale_bfloat16", _gemm, swap("b_scale", lambda s, d: s.to(torch.bfloat16)), "b_scale"),
        Malformed(g, "int4_zero_point_int32", _gemm, swap("b_zero_point", lambda z, d: z.int()), "b_zero_point"),
        Malformed(
            g,
            "int4_zero_point_transposed",
            _gemm,
            swap("b_zero_point", lambda z, d: z.t().contiguous()),
            "b_zero_point",
        ),
        Malformed(g, "int4_a_integer", _gemm, swap("a", lambda a, d: d.ints(100, M, K, dtype=U8)), "a"),
        Malformed(g, "int4_bias_float16_with_bf16_a", _gemm, swap("bias", lambda b, d: b.half()), "bias"),
        Malformed(g, "float_b_with_b_scale", _gemm, swap("b", lambda b, d: d.randn(N, K)), "b_scale"),
        Malformed(
            g, "int8_b_with_b_scale", _gemm, swap("b", lambda b, d: d.ints(100, N, K, dtype=torch.int8)), "b_scale"
        ),
        Malformed(gg, "int4_no_group_size", _grouped, _set(group_size=None), "group_size"),
        Malformed(gg, "int4_b_2d", _grouped, swap("b", lambda b, d: b[0].contiguous()), "b"),
        Malformed(gg, "int4_b_scale_2d", _grouped, swap("b_scale", lambda s, d: s[0].contiguous()), "b_scale"),
        Malformed(
            gg,
            "int4_zero_point_floor_groups",
            _grouped,
            swap("b_zero_point", lambda z, d: d.ints(16, G, N, KG - 1, dtype=U8)),
            "b_zero_point",
        ),
        Malformed(
            gg,
            "float_b_with_group_size",
            _grouped,
            lambda a, d: a.update(b=d.randn(G, N, K), b_scale=None),
            "group_size",
        ),
    ]


def _fused_calls() -> list[Malformed]:
    f = "fused_moe"
    fp8 = torch.float8_e4m3fn
    return [
        Malformed(f, "int4_act_quant", _fused, _set(act_quant="group128"), "act_quant"),
        Malformed(f, "int4_no_group_size", _fused, _set(group_size=None), "group_size"),
        Malformed(f, "int4_no_w2_scale", _fused, _set(w2_scale=None), "w2_scale"),
        Malformed(f, "int4_w2_float", _fused, swap("w2", lambda w, d: d.randn(E, HIDDEN, INTER)), "w2"),
        Malformed(f, "int4_w2_unpacked", _fused, swap("w2", lambda w, d: _packed(d, E, HIDDEN, INTER)), "w2"),
        Malformed(f, "int4_w13_odd_rows", _fused, swap("w13", lambda w, d: w[:, :-1].contiguous()), "w13"),
        Malformed(
            f, "int4_w2_scale_floor_groups", _fused, swap("w2_scale", lambda s, d: s[..., :1].contiguous()), "w2_scale"
        ),
        Malformed(
            f,
            "int4_w13_zero_point_int8",
            _fused,
            swap("w13_zero_point", lambda z, d: z.to(torch.int8)),
            "w13_zero_point",
        ),
        Malformed(
            f,
            "fp8_experts_with_zero_point",
            _fused,
            lambda a, d: a.update(
                w13=d.randn(E, 2 * INTER, HIDDEN).to(fp8),
                w2=d.randn(E, HIDDEN, INTER).to(fp8),
                w13_scale=d.uniform(0.01, 0.1, E, 2 * INTER, 1),
                w2_scale=d.uniform(0.01, 0.1, E, HIDDEN, 1),
                group_size=None,
            ),
            "w13_zero_point",
        ),
        Malformed(
            f,
            "float_experts_with_group_size",
            _fused,
            lambda a, d: a.update(
                w13=d.randn(E, 2 * INTER, HIDDEN),
                w2=d.randn(E, HIDDEN, INTER),
                w13_scale=None,
                w2_scale=None,
                w13_zero_point=None,
            ),
            "group_size",
        ),
    ]


def calls() -> list[Malformed]:
    """The malformed calls of gemm, grouped_gemm and fused_moe on packed int4 weights."""
    return _gemm_calls() + _fused_calls()
