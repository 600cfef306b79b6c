"""Cheap argument checks of the packed int4 (W4A16) paths of gemm, grouped_gemm and fused_moe (private:
the ops live in ``hetero.kernels.int4``), through the spec's own (``hetero.spec._checks_int4``), so every
backend names the same argument for the same mistake. Ranks, dtypes, shapes, devices and options only:
no tensor value is read on the host (a zero point past 15 gives wrong numbers, never a read outside a
tensor; ``hetero.spec.validate`` reads them when validation is on)."""

from __future__ import annotations

import torch

from hetero.kernels._moe_checks import check_ids, check_weights
from hetero.spec._checks_moe import check_fused_moe_options
from hetero.spec.checks import (
    PACKED_INT4,
    check_fused_moe_int4,
    check_no_int4,
    check_packed_gemm,
    check_same_device,
    check_tensor,
)

__all__ = ["check_int4_gemm", "check_int4_grouped", "check_int4_moe"]


def check_int4_gemm(a, b, bias, out_dtype, options: tuple) -> int | None:
    """gemm's packed operands when b is uint8 (returns the group size), else None (the float checks are the
    caller's; the three int4 ``options`` (b_scale, b_zero_point, group_size) must then be None)."""
    return check_packed_gemm("gemm", a, b, options, bias=bias, out_dtype=out_dtype)


def check_int4_grouped(a, b, group_ends, out_dtype, options: tuple) -> int | None:
    """grouped_gemm's packed operands and group_ends when b is uint8 (returns the group size), else None."""
    op = "grouped_gemm"
    g = check_packed_gemm(op, a, b, options, b_ndim=3, out_dtype=out_dtype)
    if g is not None:
        check_tensor(op, "group_ends", group_ends, shape=(b.shape[0],), dtypes=(torch.int32, torch.int64))
        check_same_device(op, a=a, group_ends=group_ends)
    return g


def check_int4_moe(x, w13, w2, weights, ids, activation, alpha, limit, w13_bias, w2_bias, opts: tuple) -> int | None:
    """fused_moe with packed uint8 experts: every argument checked, returns top_k. Other experts: None,
    once their int4 options are None. ``opts`` = (w13_scale, w2_scale, act_quant, act_scale_fmt,
    w13_zero_point, w2_zero_point, group_size)."""
    op = "fused_moe"
    w13_scale, w2_scale, act_quant, act_scale_fmt, z13, z2, group_size = opts
    if not (isinstance(w13, torch.Tensor) and w13.dtype == PACKED_INT4):
        if isinstance(w13, torch.Tensor):
            check_no_int4(op, "w13", w13.dtype, w13_zero_point=z13, w2_zero_point=z2, group_size=group_size)
        return None
    check_fused_moe_options(op, activation, alpha, limit)
    quant = (w13_scale, w2_scale, act_quant, act_scale_fmt)
    rows, _, _ = check_fused_moe_int4(op, x, w13, w2, (w13_bias, w2_bias), quant, (z13, z2), group_size)
    k = check_ids(op, ids, rows)
    check_weights(op, weights, tuple(ids.shape))
    check_same_device(op, x=x, w13_bias=w13_bias, w2_bias=w2_bias, weights=weights, ids=ids)
    return k
