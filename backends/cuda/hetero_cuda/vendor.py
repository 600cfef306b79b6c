"""Vendor paths that beat the portable Triton kernels on NVIDIA GPUs, chosen once per backend.

:func:`bind` returns ``{op: implementation}``, which the backend binds on itself with
``Backend.bind_from`` (``hetero.Ops`` binds ``getattr(backend, op)``, so ``hetero explain``
shows e.g. ``hetero_cuda.vendor.cublas_gemm``). Each implementation takes the
vendor library for the inputs it is built for and hands every other input to the
Triton kernel it replaces, with the same arguments: a Python-level check of
dtypes and shapes, no device synchronisation.

The paths are off (every op runs its Triton kernel) under the Triton interpreter,
on a device that is not a GPU, and with ``HETERO_CUDA_VENDOR=0`` (so the kernels
can be checked and timed on a GPU too). Nothing here imports flash_attn at module
level; torch.cuda is called only inside functions.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
from typing import Any, Callable

import torch
import torch.nn.functional as F

from hetero.kernels.torch_paths import linear_gemm, named

__all__ = [
    "ENV",
    "off_reason",
    "bind",
    "installed",
    "cublas_gemm",
    "torch_grouped_gemm",
    "torch_scaled_gemm",
    "torch_scaled_grouped_gemm",
    "flash_attn_varlen",
]

ENV = "HETERO_CUDA_VENDOR"
OPTIONAL = ("flash_attn", "flashinfer")
_FA_DTYPES = (torch.float16, torch.bfloat16)
_FA_MIN_VERSION = (2, 6)  # softcap and the [H, T] varlen LSE layout


def off_reason(interpreted: bool, device: torch.device) -> str | None:
    """Why the vendor paths are off for this backend instance, or None when they are on."""
    if interpreted:
        return "the Triton interpreter runs every op through the kernels"
    if device.type != "cuda":
        return f"device {device} is not a GPU"
    if os.environ.get(ENV, "").strip() == "0":
        return f"{ENV}=0"
    return None


def installed() -> dict[str, str]:
    """Optional vendor packages and their versions ("not installed"), without importing them."""
    found = {}
    for mod in OPTIONAL:
        if importlib.util.find_spec(mod) is None:
            found[mod] = "not installed"
            continue
        try:
            found[mod] = md.version(mod.replace("_", "-"))
        except md.PackageNotFoundError:
            found[mod] = "installed"
    return found


def bind(backend: Any) -> dict[str, Callable]:
    """The vendor implementations for ``backend`` (a CudaBackend on a real GPU), each wrapping its Triton op."""
    cap = backend.capability
    paths: dict[str, Callable] = {"gemm": cublas_gemm(backend.gemm)}
    if cap >= (9, 0) and hasattr(F, "grouped_mm"):  # CUTLASS grouped kernels; older parts loop in torch
        paths["grouped_gemm"] = torch_grouped_gemm(backend.grouped_gemm)
    if cap >= (8, 9) and hasattr(torch, "_scaled_mm"):
        paths["scaled_gemm"] = torch_scaled_gemm(backend.scaled_gemm, rowwise=cap >= (9, 0))
    if cap >= (9, 0) and hasattr(torch, "_scaled_grouped_mm"):
        paths["scaled_grouped_gemm"] = torch_scaled_grouped_gemm(backend.scaled_grouped_gemm)
    fa = _flash_attn_varlen_func()
    if fa is not None and cap >= (8, 0):
        paths["varlen_attention"] = flash_attn_varlen(backend.varlen_attention, fa)
    return paths


# ----------------------------------------------------------------------------- gemm


def cublas_gemm(triton_gemm: Callable) -> Callable:
    """torch's linear (cuBLAS/cuBLASLt) when operands, bias and output share a dtype."""
    return linear_gemm(triton_gemm, "cublas_gemm", __name__)


def _grouped_fits(a: torch.Tensor, b: torch.Tensor, group_ends: torch.Tensor, out_dtype: torch.dtype | None) -> bool:
    """torch's grouped_mm takes bfloat16 (out too: a float32 out_dtype is not taken by every build),
    16-byte aligned rows and int32 end offsets."""
    return (
        a.dtype is torch.bfloat16
        and b.dtype is torch.bfloat16
        and out_dtype in (None, torch.bfloat16)
        and group_ends.dtype is torch.int32
        and a.shape[0] > 0
        and b.shape[0] > 0
        and a.shape[1] % 8 == 0
        and b.shape[1] % 8 == 0
        and a.is_contiguous()
        and b.is_contiguous()
        and a.data_ptr() % 16 == 0
        and b.data_ptr() % 16 == 0
    )


def torch_grouped_gemm(triton_grouped_gemm: Callable) -> Callable:
    """torch.nn.functional.grouped_mm (CUTLASS grouped GEMM on sm90) for bfloat16; rows past the
    last group are zeroed."""

    def grouped_gemm(a, b, group_ends, *, out_dtype=None, b_scale=None, b_zero_point=None, group_size=None):
        int4 = {"b_scale": b_scale, "b_zero_point": b_zero_point, "group_size": group_size}
        if any(v is not None for v in int4.values()):  # packed int4 experts: the Triton kernel
            return triton_grouped_gemm(a, b, group_ends, out_dtype=out_dtype, **int4)
        if not _grouped_fits(a, b, group_ends, out_dtype):
            return triton_grouped_gemm(a, b, group_ends, out_dtype=out_dtype)
        out = F.grouped_mm(a, b.transpose(-2, -1), offs=group_ends)
        rows = torch.arange(a.shape[0], device=a.device).unsqueeze(1)
        return out.masked_fill_(rows >= group_ends[-1:], 0)  # grouped_mm leaves them unwritten

    return named(grouped_gemm, "torch_grouped_gemm")


def _scale_form(scale: torch.Tensor, rows: int) -> str:
    """ "tensor", "row" or "block" (a block scale of one K-block is a row scale: same numbers)."""
    if scale.numel() == 1:
        return "tensor"
    return "row" if tuple(scale.shape) == (rows, 1) else "block"


def _scaled_mm_args(a, b, a_scale, b_scale, bias, out_dtype, rowwise: bool):
    """(scale_a, scale_b, mm_out_dtype) for torch._scaled_mm, or None when the inputs need the Triton kernel."""
    (m, k), n = a.shape, b.shape[0]
    if not (
        a.dtype is torch.float8_e4m3fn
        and b.dtype is torch.float8_e4m3fn
        and m > 0
        and k % 16 == 0
        and n % 16 == 0
        and a.is_contiguous()
        and b.is_contiguous()
        and a_scale.dtype is torch.float32
        and b_scale.dtype is torch.float32
    ):
        return None
    fa, fb = _scale_form(a_scale, m), _scale_form(b_scale, n)
    if fa == fb == "tensor":  # bias added in float32 after the product: one rounding, like the reference
        return a_scale.reshape(()), b_scale.reshape(()), torch.float32 if bias is not None else out_dtype
    if not rowwise or "block" in (fa, fb) or bias is not None or out_dtype is not torch.bfloat16:
        return None
    sa = a_scale.reshape(1, 1).expand(m, 1) if fa == "tensor" else a_scale
    sb = b_scale.reshape(1, 1).expand(1, n) if fb == "tensor" else b_scale.reshape(1, n)
    return sa.contiguous(), sb.contiguous(), torch.bfloat16


def torch_scaled_gemm(triton_scaled_gemm: Callable, *, rowwise: bool) -> Callable:
    """torch._scaled_mm (cuBLASLt fp8) for float8_e4m3fn with per-tensor scales, and per-token/per-channel
    scales on sm90 (bfloat16 out, no bias); block scales and int8 go to the Triton kernel."""

    def scaled_gemm(a, b, a_scale, b_scale, *, bias=None, out_dtype=torch.bfloat16):
        args = _scaled_mm_args(a, b, a_scale, b_scale, bias, out_dtype, rowwise)
        if args is None:
            return triton_scaled_gemm(a, b, a_scale, b_scale, bias=bias, out_dtype=out_dtype)
        sa, sb, mm_dtype = args
        out = torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=mm_dtype)
        if bias is None:
            return out
        return out.add_(bias).to(out_dtype)

    return named(scaled_gemm, "torch_scaled_gemm")


def _scaled_grouped_args(a, b, a_scale, b_scale, group_ends, a_zero_point, out_dtype):
    """(scale_a [M], scale_b [G, N]) for torch._scaled_grouped_mm, or None when the call needs the Triton kernel:
    it takes e4m3fn with row-wise scales only (per token / per channel; per tensor and per group expanded),
    bfloat16 out, 16-byte aligned strides and int32 ends; no zero point, no block scales."""
    if not (
        a.dtype is torch.float8_e4m3fn
        and b.dtype is torch.float8_e4m3fn
        and a_zero_point is None
        and out_dtype is torch.bfloat16
        and group_ends.dtype is torch.int32
        and a.shape[0] > 0
        and a.shape[1] % 16 == 0
        and b.shape[1] % 16 == 0
        and a.is_contiguous()
        and b.is_contiguous()
        and a_scale.dtype is torch.float32
        and b_scale.dtype is torch.float32
    ):
        return None
    (m, _k), (groups, n) = a.shape, b.shape[:2]
    if tuple(a_scale.shape) == (m, 1):
        sa = a_scale.reshape(m)
    elif a_scale.numel() == 1 and a_scale.ndim <= 2:
        sa = a_scale.reshape(1).expand(m)
    else:
        return None
    if tuple(b_scale.shape) == (groups, n, 1):
        sb = b_scale.reshape(groups, n)
    elif tuple(b_scale.shape) == (groups,):
        sb = b_scale.reshape(groups, 1).expand(groups, n)
    else:
        return None
    return sa.contiguous(), sb.contiguous()


def torch_scaled_grouped_gemm(triton_scaled_grouped_gemm: Callable) -> Callable:
    """torch._scaled_grouped_mm (CUTLASS fp8 grouped GEMM, sm90+) for e4m3fn with row-wise scales and
    bfloat16 out; block scales, int8, zero points and e4m3fnuz go to the Triton kernel."""

    def scaled_grouped_gemm(a, b, a_scale, b_scale, group_ends, *, a_zero_point=None, out_dtype=torch.bfloat16):
        args = _scaled_grouped_args(a, b, a_scale, b_scale, group_ends, a_zero_point, out_dtype)
        if args is None:
            return triton_scaled_grouped_gemm(
                a, b, a_scale, b_scale, group_ends, a_zero_point=a_zero_point, out_dtype=out_dtype
            )
        out = torch._scaled_grouped_mm(
            a, b.transpose(-2, -1), args[0], args[1], offs=group_ends, out_dtype=torch.bfloat16
        )
        rows = torch.arange(a.shape[0], device=a.device).unsqueeze(1)
        return out.masked_fill_(rows >= group_ends[-1:], 0)  # rows past the last group are left unwritten

    return named(scaled_grouped_gemm, "torch_scaled_grouped_gemm")


# ----------------------------------------------------------------------------- attention


def _flash_attn_varlen_func() -> Callable | None:
    """flash_attn.flash_attn_varlen_func when flash-attn >= 2.6 imports, else None."""
    if importlib.util.find_spec("flash_attn") is None:
        return None
    try:
        import flash_attn

        version = tuple(int(p) for p in flash_attn.__version__.split(".")[:2])
    except Exception:  # a broken build (ABI mismatch) must not break the backend
        return None
    return flash_attn.flash_attn_varlen_func if version >= _FA_MIN_VERSION else None


def _fa_fits(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    d = query.shape[-1]
    return (
        query.dtype in _FA_DTYPES
        and key.dtype == query.dtype
        and value.dtype == query.dtype
        and value.shape[-1] == d
        and d % 8 == 0
        and d <= 256
        and query.shape[0] > 0
        and key.shape[0] > 0
        and query.stride(-1) == 1
        and key.stride(-1) == 1
        and value.stride(-1) == 1
    )


def flash_attn_varlen(triton_varlen: Callable, fa_varlen: Callable) -> Callable:
    """flash-attn 2's varlen kernel for fp16/bf16 with D == Dv <= 256 (not MLA prefill's 192/128).

    Its LSE is [H, T] and +inf for a row that sees no key; hetero's is [T, H] and -inf.
    """

    def varlen_attention(
        query,
        key,
        value,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        *,
        scale,
        causal=True,
        window=(-1, -1),
        softcap=0.0,
        return_lse=False,
    ):
        if not _fa_fits(query, key, value):
            return triton_varlen(
                query,
                key,
                value,
                cu_seqlens_q,
                cu_seqlens_k,
                max_seqlen_q,
                max_seqlen_k,
                scale=scale,
                causal=causal,
                window=window,
                softcap=softcap,
                return_lse=return_lse,
            )
        res = fa_varlen(
            query,
            key,
            value,
            cu_seqlens_q,
            cu_seqlens_k,
            max_seqlen_q,
            max_seqlen_k,
            softmax_scale=scale,
            causal=causal,
            window_size=(int(window[0]), int(window[1])),
            softcap=softcap,
            return_attn_probs=return_lse,
        )
        if not return_lse:
            return res
        lse = res[1].t().contiguous()
        return res[0], lse.masked_fill_(lse == float("inf"), float("-inf"))

    return named(varlen_attention, "flash_attn_varlen")
