"""Reference GEMMs: dense, scaled (fp8/int8 with per-tensor, per-row or 128-block scales) and grouped;
gemm and grouped_gemm on packed int4 weights (spec 1.9) are ``_int4``'s.

Plain PyTorch on whatever device the inputs live on. Floating GEMMs accumulate in
float32 (float64 when an input is float64) and round once to the output dtype.
scaled_gemm works like the hardware it models: the quantized product of each
K-block is accumulated unscaled (exactly, in integers, for int8), then scaled
in float32 and summed over the blocks.
"""

from __future__ import annotations

import torch

from hetero.spec.checks import (
    check_bias,
    check_group_ends,
    check_operands,
    check_out_dtype,
    check_packed_gemm,
    check_same_device,
    check_scaled_gemm,
    check_tensor,
    scale_blocks,
)
from hetero.spec.gemm import SCALE_BLOCK
from hetero.spec.types import FLOAT_DTYPES
from hetero_cpu_ref._int4 import check_zero_points, int4_grouped_linear, int4_linear
from hetero_cpu_ref._util import acc_dtype, up

__all__ = ["gemm", "scaled_gemm", "grouped_gemm"]


def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    b_scale: torch.Tensor | None = None,
    b_zero_point: torch.Tensor | None = None,
    group_size: int | None = None,
) -> torch.Tensor:
    op = "gemm"
    packed = (b_scale, b_zero_point, group_size)
    g = check_packed_gemm(op, a, b, packed, bias=bias, out_dtype=out_dtype)
    if g is not None:  # spec 1.9: a packed int4 b (W4A16)
        check_zero_points(op, ("b_zero_point", b_zero_point))
        return int4_linear(a, b, b_scale, b_zero_point, g, bias, a.dtype if out_dtype is None else out_dtype)
    check_operands(op, a, b, FLOAT_DTYPES)
    out_dtype = a.dtype if out_dtype is None else out_dtype
    check_out_dtype(op, out_dtype, FLOAT_DTYPES)
    check_bias(op, bias, b.shape[0], FLOAT_DTYPES, a.device)

    acc = acc_dtype(a, b, bias)
    out = up(a, acc) @ up(b, acc).T
    if bias is not None:
        out = out + up(bias, acc)
    return out.to(out_dtype)


def _expand_scale(scale: torch.Tensor, form: str, rows: int, kblocks: int) -> torch.Tensor:
    """A scale as float32 [rows, kblocks]: entry [r, j] covers row r and K-block j."""
    if form == "tensor":
        return scale.reshape(1, 1).expand(rows, kblocks)
    if form == "row":
        return scale.expand(rows, kblocks)
    if scale.shape[0] == rows:  # a_scale blocks: one row per token
        return scale
    return scale.repeat_interleave(SCALE_BLOCK, dim=0)[:rows]  # b_scale: one row per 128 channels


def _raw_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b.T of the quantized values, unscaled, as float32 [M, N].

    fp8 values and their pairwise products are exact in float32; the sum is
    accumulated in float32. int8 is summed exactly in integers, as the int32
    accumulators of int8 GEMM hardware do: each 128-column chunk is at most
    128 * 128 * 128 = 2**21 in magnitude, exact in float32, then the chunks
    are added in int64.
    """
    if a.dtype != torch.int8:
        return a.float() @ b.float().T
    total = torch.zeros(a.shape[0], b.shape[0], dtype=torch.int64, device=a.device)
    for k0 in range(0, a.shape[1], SCALE_BLOCK):
        chunk = a[:, k0 : k0 + SCALE_BLOCK].float() @ b[:, k0 : k0 + SCALE_BLOCK].float().T
        total += chunk.to(torch.int64)
    return total.float()


def scaled_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    op = "scaled_gemm"
    m, k, n, a_form, b_form = check_scaled_gemm(op, a, b, a_scale, b_scale, bias, out_dtype)

    # Scales are constant over each K-block (the whole of K unless a scale is
    # block-wise), so dequant(a) @ dequant(b).T = sum over blocks j of
    # a_scale[:, j] * b_scale[:, j].T * (a_j @ b_j.T).
    kblocks = scale_blocks(k) if "block" in (a_form, b_form) else 1
    width = SCALE_BLOCK if kblocks > 1 else k
    sa = _expand_scale(a_scale, a_form, m, kblocks)
    sb = _expand_scale(b_scale, b_form, n, kblocks)
    out = torch.zeros(m, n, dtype=torch.float32, device=a.device)
    for j in range(kblocks):
        cols = slice(j * width, (j + 1) * width)
        out += _raw_product(a[:, cols], b[:, cols]) * sa[:, j : j + 1] * sb[:, j].unsqueeze(0)
    if bias is not None:
        out += bias.float()
    return out.to(out_dtype)


def grouped_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    group_ends: torch.Tensor,
    *,
    out_dtype: torch.dtype | None = None,
    b_scale: torch.Tensor | None = None,
    b_zero_point: torch.Tensor | None = None,
    group_size: int | None = None,
) -> torch.Tensor:
    op = "grouped_gemm"
    g = check_packed_gemm(op, a, b, (b_scale, b_zero_point, group_size), b_ndim=3, out_dtype=out_dtype)
    if g is None:
        check_operands(op, a, b, FLOAT_DTYPES, b_ndim=3)
    out_dtype = a.dtype if out_dtype is None else out_dtype
    check_out_dtype(op, out_dtype, FLOAT_DTYPES)
    check_tensor(op, "group_ends", group_ends)
    check_same_device(op, a=a, group_ends=group_ends)  # before reading its values
    ends = check_group_ends(op, group_ends, b.shape[0], a.shape[0])
    if g is not None:  # spec 1.9: packed int4 weights (W4A16)
        check_zero_points(op, ("b_zero_point", b_zero_point))
        return int4_grouped_linear(a, b, b_scale, b_zero_point, g, ends, None, out_dtype)
    return grouped_linear(a, b, ends, None, out_dtype)


def grouped_linear(
    a: torch.Tensor, b: torch.Tensor, ends: list[int], bias: torch.Tensor | None, out_dtype: torch.dtype
) -> torch.Tensor:
    """Rows [ends[g-1], ends[g]) of ``a @ b[g].T (+ bias[g])`` in float32 (float64 for float64 inputs),
    rounded once to out_dtype; rows past the last group are zero. No checks: the callers' own."""
    acc = acc_dtype(a, b)
    out = torch.zeros(a.shape[0], b.shape[1], dtype=out_dtype, device=a.device)
    start = 0
    for g, end in enumerate(ends):
        if end > start:
            y = up(a[start:end], acc) @ up(b[g], acc).T
            out[start:end] = (y if bias is None else y + up(bias[g], acc)).to(out_dtype)
        start = end
    return out
