"""Inputs of the quantization cases: quantize_activation and scaled_grouped_gemm."""

from __future__ import annotations

import torch

from hetero.verify.inputs.fused_moe import expert_pool
from hetero.verify.inputs.quant_draw import activations, quantize_rows, quantize_weights, ties

__all__ = ["FNUZ", "FP8", "INT8", "grouped", "quantize"]

FP8, FNUZ, INT8 = torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.int8


# ---------------------------------------------------------------- quantize_activation


def quantize(
    m: int,
    k: int,
    qdtype: torch.dtype,
    group: int | None,
    *,
    fmt: str = "float",
    asym: bool = False,
    edge: str = "",
    view: bool = False,
):
    def build(gen: torch.Generator, dtype: torch.dtype):
        if edge == "ties":
            x = ties(gen, m, k, qdtype, dtype)
        elif view:
            x = activations(gen, m, k + 64, dtype)[:, 64:]
        else:
            x = activations(gen, m, k, dtype, edge)
        args = {"x": x, "dtype": qdtype, "group_size": group, "scale_fmt": fmt}
        if asym:
            args["asymmetric"] = True
        return args

    return build


# ---------------------------------------------------------------- scaled_grouped_gemm


def _group_ends(gen: torch.Generator, rows: int, groups: int, empty: tuple[int, ...]) -> torch.Tensor:
    pool = expert_pool(groups, empty)
    counts = torch.bincount(pool[torch.randint(0, len(pool), (rows,), generator=gen)], minlength=groups)
    return counts.cumsum(0).to(torch.int32)


def grouped(
    rows: int,
    groups: int,
    n: int,
    k: int,
    a_form: str,
    b_form: str,
    *,
    tail: int = 0,
    empty: tuple[int, ...] = (),
    zp: bool = False,
    out_dtype: torch.dtype | None = None,
):
    def build(gen: torch.Generator, qdtype: torch.dtype):
        a, a_scale, a_zp = quantize_rows(activations(gen, rows + tail, k, torch.float32), qdtype, a_form, zp)
        b, b_scale = quantize_weights(gen, groups, n, k, qdtype, b_form)
        args = {
            "a": a,
            "b": b,
            "a_scale": a_scale,
            "b_scale": b_scale,
            "group_ends": _group_ends(gen, rows, groups, empty),
        }
        if a_zp is not None:
            args["a_zero_point"] = a_zp
        if out_dtype is not None:
            args["out_dtype"] = out_dtype
        return args

    return build
