"""Argument validation of the GEMM ops (gemm, scaled_gemm, grouped_gemm), shared by the backends that check in Python.

Every failure is a hetero.OpError naming the op, the argument, what was expected
and what came.
"""

from __future__ import annotations

import torch

from hetero.errors import OpError
from hetero.spec._checks_core import check_scale_form, check_tensor, scale_blocks

__all__ = [
    "check_scaled_gemm",
    "QUANT_DTYPES",
    "SCALED_OUT_DTYPES",
    "check_operands",
    "check_out_dtype",
    "check_bias",
]

#: Operand dtypes of scaled_gemm: fp8 (OCP e4m3, and AMD MI300's e4m3fnuz) and int8.
QUANT_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.int8)
#: Output dtypes of scaled_gemm.
SCALED_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _dt(d: object) -> str:
    return str(d).replace("torch.", "")


def check_operands(op: str, a: object, b: object, dtypes: tuple[torch.dtype, ...], b_ndim: int = 2) -> None:
    """a [M, K] and b [..., N, K] (b_ndim dims) of one dtype from `dtypes`, on one device, K matching."""
    check_tensor(op, "a", a, ndim=2, dtypes=dtypes)
    check_tensor(op, "b", b, ndim=b_ndim, dtypes=dtypes)
    assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
    if not (b.dtype == a.dtype):
        raise OpError(op, "b", f"dtype {_dt(a.dtype)} (that of 'a')", str(_dt(b.dtype)))
    if not (b.device == a.device):
        raise OpError(op, "b", f"device {a.device} (that of 'a')", str(b.device))
    layout = "[N, K]" if b_ndim == 2 else "[G, N, K]"
    if not (b.shape[-1] == a.shape[1]):
        raise OpError(
            op,
            "b",
            f"shape {layout} with K = {a.shape[1]} (a's columns; b is in nn.Linear layout)",
            f"shape {list(b.shape)}",
        )


def check_out_dtype(op: str, out_dtype: object, allowed: tuple[torch.dtype, ...]) -> None:
    if out_dtype not in allowed:
        raise OpError(op, "out_dtype", "one of " + ", ".join(_dt(d) for d in allowed), str(_dt(out_dtype)))


def check_bias(op: str, bias: object, n: int, dtypes: tuple[torch.dtype, ...], device: torch.device) -> None:
    """bias None, or [N] of one of `dtypes` on `device`."""
    if bias is None:
        return
    check_tensor(op, "bias", bias, shape=(n,), dtypes=dtypes)
    assert isinstance(bias, torch.Tensor)
    if not (bias.device == device):
        raise OpError(op, "bias", f"device {device} (that of 'a')", str(bias.device))


def check_scaled_gemm(
    op: str, a: object, b: object, a_scale: object, b_scale: object, bias: object, out_dtype: object
) -> tuple[int, int, int, str, str]:
    """scaled_gemm's operands, scale forms, bias and out_dtype; returns (M, K, N, a_scale's form, b_scale's form)."""
    check_operands(op, a, b, QUANT_DTYPES)
    (m, k), n = a.shape, b.shape[0]
    a_form = check_scale_form(op, "a_scale", a_scale, m, m, k, a.device)
    b_form = check_scale_form(op, "b_scale", b_scale, n, scale_blocks(n), k, a.device)
    check_out_dtype(op, out_dtype, SCALED_OUT_DTYPES)
    check_bias(op, bias, n, tuple(dict.fromkeys((torch.float32, out_dtype))), a.device)
    return m, k, n, a_form, b_form
