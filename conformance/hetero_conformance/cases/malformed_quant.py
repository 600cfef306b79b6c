"""Malformed calls of the quantized ops (spec 1.4): quantize_activation, scaled_grouped_gemm and
fused_moe's quantized options."""

from __future__ import annotations

import torch

from hetero_conformance.cases._malformed import Draw, Malformed, put, swap

__all__ = ["calls"]

ROWS, K, N, G = 6, 320, 192, 3  # K = 2.5 blocks of 128, N = 1.5
TOKENS, HIDDEN, E, TOP_K, INTER = 4, 256, 4, 2, 64
FP8 = torch.float8_e4m3fn


def _fp8(d: Draw, *shape: int, dtype: torch.dtype = FP8) -> torch.Tensor:
    return (d.randn(*shape, dtype=torch.float32) * 16).clamp(-127, 127).round().to(dtype)


def _quantize(d: Draw) -> dict:
    return {"x": d.randn(ROWS, K), "dtype": FP8, "group_size": 128, "scale_fmt": "float"}


def _grouped(d: Draw) -> dict:
    return {
        "a": _fp8(d, ROWS, K),
        "b": _fp8(d, G, N, K),
        "a_scale": d.uniform(0.01, 0.1, ROWS, 3),
        "b_scale": d.uniform(0.01, 0.1, G, 2, 3),
        "group_ends": d.tensor([2, 2, 5]),
    }


def _int8_zp(d: Draw) -> dict:
    i8 = torch.int8
    return {
        "a": _fp8(d, ROWS, K, dtype=i8),
        "b": _fp8(d, G, N, K, dtype=i8),
        "a_scale": d.uniform(0.01, 0.1, ROWS, 1),
        "b_scale": d.uniform(0.01, 0.1, G, N, 1),
        "group_ends": d.tensor([1, 4, 6]),
        "a_zero_point": d.ints(20, ROWS, 1) - 10,
    }


def _fused(d: Draw) -> dict:
    return {
        "x": d.randn(TOKENS, HIDDEN),
        "w13": _fp8(d, E, 2 * INTER, HIDDEN),
        "w2": _fp8(d, E, HIDDEN, INTER),
        "weights": d.uniform(0.1, 1.0, TOKENS, TOP_K),
        "ids": d.ints(E, TOKENS, TOP_K),
        "w13_scale": d.uniform(0.01, 0.1, E, 1, 2),
        "w2_scale": d.uniform(0.01, 0.1, E, 2, 1),
        "act_quant": "group128",
    }


def _options(**options: object):
    return lambda args, d: args.update(options)


def _quantize_calls() -> list[Malformed]:
    q = "quantize_activation"
    return [
        Malformed(q, "dtype_bfloat16", _quantize, swap("dtype", lambda v, d: torch.bfloat16), "dtype"),
        Malformed(q, "group_size_zero", _quantize, swap("group_size", lambda v, d: 0), "group_size"),
        Malformed(q, "group_size_float", _quantize, swap("group_size", lambda v, d: 128.0), "group_size"),
        Malformed(q, "scale_fmt_unknown", _quantize, swap("scale_fmt", lambda v, d: "e8m0"), "scale_fmt"),
        Malformed(q, "asymmetric_fp8", _quantize, swap("asymmetric", lambda v, d: True), "asymmetric"),
        Malformed(q, "x_int8", _quantize, swap("x", lambda x, d: x.to(torch.int8)), "x"),
        Malformed(q, "x_3d", _quantize, swap("x", lambda x, d: x.reshape(2, 3, K)), "x"),
    ]


def _grouped_calls() -> list[Malformed]:
    s = "scaled_grouped_gemm"
    return [
        Malformed(s, "group_ends_past_M", _grouped, put("group_ends", 2, ROWS + 1), "group_ends", index=True),
        Malformed(s, "group_ends_decreasing", _grouped, put("group_ends", 1, 1), "group_ends", index=True),
        Malformed(s, "a_bfloat16", _grouped, swap("a", lambda a, d: a.to(torch.bfloat16)), "a"),
        Malformed(s, "b_int8_with_fp8_a", _grouped, swap("b", lambda b, d: b.float().to(torch.int8)), "b"),
        Malformed(s, "a_scale_floor_blocks", _grouped, swap("a_scale", lambda v, d: v[:, :2].contiguous()), "a_scale"),
        Malformed(s, "b_scale_2d", _grouped, swap("b_scale", lambda v, d: v[0].contiguous()), "b_scale"),
        Malformed(
            s, "b_scale_floor_n_blocks", _grouped, swap("b_scale", lambda v, d: v[:, :1].contiguous()), "b_scale"
        ),
        Malformed(s, "b_scale_bfloat16", _grouped, swap("b_scale", lambda v, d: v.to(torch.bfloat16)), "b_scale"),
        Malformed(s, "out_dtype_int8", _grouped, swap("out_dtype", lambda v, d: torch.int8), "out_dtype"),
        Malformed(
            s, "zero_point_with_fp8", _grouped, swap("a_zero_point", lambda v, d: d.ints(3, ROWS, 1)), "a_zero_point"
        ),
        Malformed(s, "zero_point_int64", _int8_zp, swap("a_zero_point", lambda v, d: v.long()), "a_zero_point"),
        Malformed(
            s,
            "zero_point_with_tensor_scale",
            _int8_zp,
            swap("a_scale", lambda v, d: v[:1, :1].reshape(1).contiguous()),
            "a_zero_point",
        ),
    ]


def _fused_calls() -> list[Malformed]:
    f = "fused_moe"
    return [
        Malformed(f, "quant_w13_scale_only", _fused, _options(w2_scale=None), "w2_scale"),
        Malformed(
            f,
            "quant_scale_with_float_weights",
            _fused,
            lambda a, d: a.update(w13=d.randn(E, 2 * INTER, HIDDEN), w2=d.randn(E, HIDDEN, INTER), act_quant=None),
            "w13_scale",
        ),
        Malformed(
            f,
            "act_quant_with_float_weights",
            _fused,
            lambda a, d: a.update(
                w13=d.randn(E, 2 * INTER, HIDDEN), w2=d.randn(E, HIDDEN, INTER), w13_scale=None, w2_scale=None
            ),
            "act_quant",
        ),
        Malformed(f, "act_quant_unknown", _fused, _options(act_quant="group64"), "act_quant"),
        Malformed(f, "act_scale_fmt_unknown", _fused, _options(act_scale_fmt="e8m0"), "act_scale_fmt"),
        Malformed(
            f,
            "w13_scale_wrong_blocks",
            _fused,
            swap("w13_scale", lambda v, d: d.uniform(0.01, 0.1, E, 2, 2)),
            "w13_scale",
        ),
        Malformed(f, "w2_int8_with_fp8_w13", _fused, swap("w2", lambda w, d: w.float().to(torch.int8)), "w2"),
    ]


def calls() -> list[Malformed]:
    return _quantize_calls() + _grouped_calls() + _fused_calls()
