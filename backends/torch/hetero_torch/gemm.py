"""GEMMs from torch's batched operators: gemm, grouped_gemm, scaled_gemm, quantize_activation and
scaled_grouped_gemm.

Semantics: ``hetero.spec.gemm``. Floating GEMMs accumulate in float32 (float64 for float64 inputs)
and round once; the scaled GEMMs multiply the dequantized operands in float32 (``torch._scaled_mm``
on CUDA for fp8 with per-tensor or per-row scales). group_ends are read on the host (their range
guards every index).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hetero.spec.checks import (
    check_bias,
    check_group_ends,
    check_operands,
    check_out_dtype,
    check_packed_gemm,
    check_quantize_inputs,
    check_same_device,
    check_scaled_gemm,
    check_scaled_grouped,
    check_tensor,
)
from hetero.spec.types import FLOAT_DTYPES
from hetero_torch._gemm_grouped import grouped_matmul
from hetero_torch._gemm_packed import compiled_linear, packed_linear
from hetero_torch._gemm_quant import quantize, scaled_grouped_product, scaled_product
from hetero_torch._int4 import int4_gemm, int4_grouped_gemm
from hetero_torch._layers_util import acc_dtype

__all__ = ["gemm", "grouped_gemm", "scaled_gemm", "quantize_activation", "scaled_grouped_gemm"]


def gemm(a, b, *, bias=None, out_dtype=None, b_scale=None, b_zero_point=None, group_size=None):
    op = "gemm"
    g = check_packed_gemm(op, a, b, (b_scale, b_zero_point, group_size), bias=bias, out_dtype=out_dtype)
    if g is not None:  # spec 1.9: a packed int4 b (W4A16)
        return int4_gemm(a, b, b_scale, b_zero_point, g, bias, a.dtype if out_dtype is None else out_dtype)
    check_operands(op, a, b, FLOAT_DTYPES)
    out_dtype = a.dtype if out_dtype is None else out_dtype
    check_out_dtype(op, out_dtype, FLOAT_DTYPES)
    check_bias(op, bias, b.shape[0], FLOAT_DTYPES, a.device)
    native = a.dtype != torch.float16 or a.device.type != "cpu"  # torch's CPU float16 GEMM is not float32-accumulated
    if native and out_dtype == a.dtype and (bias is None or bias.dtype == a.dtype):
        if torch.compiler.is_compiling():
            return compiled_linear(a, b, bias)
        out = packed_linear(a, b, bias)
        return F.linear(a, b, bias) if out is None else out
    acc = acc_dtype(a, b, bias)
    return F.linear(a.to(acc), b.to(acc), None if bias is None else bias.to(acc)).to(out_dtype)


def grouped_gemm(a, b, group_ends, *, out_dtype=None, b_scale=None, b_zero_point=None, group_size=None):
    op = "grouped_gemm"
    g = check_packed_gemm(op, a, b, (b_scale, b_zero_point, group_size), b_ndim=3, out_dtype=out_dtype)
    if g is None:
        check_operands(op, a, b, FLOAT_DTYPES, b_ndim=3)
    out_dtype = a.dtype if out_dtype is None else out_dtype
    check_out_dtype(op, out_dtype, FLOAT_DTYPES)
    check_tensor(op, "group_ends", group_ends)
    check_same_device(op, a=a, group_ends=group_ends)
    ends = check_group_ends(op, group_ends, b.shape[0], a.shape[0])
    if g is not None:  # spec 1.9: packed int4 weights (W4A16)
        return int4_grouped_gemm(a, b, b_scale, b_zero_point, g, ends, out_dtype)
    return grouped_matmul(a, b, group_ends, ends, out_dtype)


def _cuda_scaled_mm(a, b, a_scale, b_scale, forms, out_dtype):
    """torch._scaled_mm (cuBLASLt) for fp8 e4m3fn on CUDA with per-tensor scales on both operands, or
    per-row scales on both and a bfloat16 output, N and K multiples of 16; None where it does not fit
    (then the float32 dequantized product runs)."""
    fits = (
        a.device.type == "cuda"
        and a.dtype == torch.float8_e4m3fn
        and hasattr(torch, "_scaled_mm")
        and forms[0] == forms[1]
        and forms[0] in ("tensor", "row")
        and a.shape[0] > 0
        and a.shape[1] % 16 == 0
        and b.shape[0] % 16 == 0
        and (forms[0] == "tensor" or out_dtype == torch.bfloat16)
    )
    if not fits:
        return None
    if forms[0] == "tensor":
        sa, sb = a_scale.reshape(()).contiguous(), b_scale.reshape(()).contiguous()
    else:
        sa, sb = a_scale.contiguous(), b_scale.reshape(1, -1).contiguous()
    try:
        return torch._scaled_mm(a.contiguous(), b.contiguous().t(), scale_a=sa, scale_b=sb, out_dtype=out_dtype)
    except (RuntimeError, NotImplementedError):
        return None  # an arch or torch build without this fp8 path


def scaled_gemm(a, b, a_scale, b_scale, *, bias=None, out_dtype=torch.bfloat16):
    op = "scaled_gemm"
    m, k, n, a_form, b_form = check_scaled_gemm(op, a, b, a_scale, b_scale, bias, out_dtype)
    if bias is None:
        out = _cuda_scaled_mm(a, b, a_scale, b_scale, (a_form, b_form), out_dtype)
        if out is not None:
            return out
    out = scaled_product(a, b, a_scale, b_scale, a_form, b_form)
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


def quantize_activation(x, *, dtype, group_size=128, scale_fmt="float", asymmetric=False):
    check_quantize_inputs("quantize_activation", x, dtype, group_size, scale_fmt, asymmetric)
    return quantize(x, dtype, group_size, scale_fmt == "ue8m0", asymmetric)


def scaled_grouped_gemm(a, b, a_scale, b_scale, group_ends, *, a_zero_point=None, out_dtype=torch.bfloat16):
    op = "scaled_grouped_gemm"
    forms = check_scaled_grouped(op, a, b, a_scale, b_scale, group_ends, a_zero_point, out_dtype)
    ends = check_group_ends(op, group_ends, b.shape[0], a.shape[0])
    return scaled_grouped_product(a, b, a_scale, b_scale, group_ends, ends, forms, a_zero_point).to(out_dtype)
