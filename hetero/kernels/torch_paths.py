"""Vendor fast paths that torch itself provides on every GPU build, shared by the GPU backends.

Each wraps the Triton op it stands in for and hands it every input it does not take.
"""

from __future__ import annotations

from typing import Callable

import torch.nn.functional as F

__all__ = ["named", "linear_gemm"]


def named(fn: Callable, name: str, module: str | None = None) -> Callable:
    """Give a wrapper the name ``hetero explain`` shows for it (and the module that binds it)."""
    fn.__name__ = fn.__qualname__ = name
    if module is not None:
        fn.__module__ = module
    return fn


def linear_gemm(triton_gemm: Callable, name: str, module: str) -> Callable:
    """torch's linear (cuBLAS/cuBLASLt on CUDA, hipBLASLt on ROCm; bias in the epilogue) when
    operands, bias and output share a dtype; the Triton gemm otherwise (packed int4 weights among them)."""

    def gemm(a, b, *, bias=None, out_dtype=None, b_scale=None, b_zero_point=None, group_size=None):
        int4 = {"b_scale": b_scale, "b_zero_point": b_zero_point, "group_size": group_size}
        if any(v is not None for v in int4.values()):
            return triton_gemm(a, b, bias=bias, out_dtype=out_dtype, **int4)
        if a.dtype == b.dtype and out_dtype in (None, a.dtype) and (bias is None or bias.dtype == a.dtype):
            return F.linear(a, b, bias)
        return triton_gemm(a, b, bias=bias, out_dtype=out_dtype)

    return named(gemm, name, module)
