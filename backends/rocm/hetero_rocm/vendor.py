"""Vendor paths that beat the portable Triton kernels on AMD GPUs, chosen once per backend.

:func:`bind` returns ``{op: implementation}``, which the backend binds on itself with
``Backend.bind_from``, so ``hetero explain rocm`` names them (``hetero_rocm.vendor.hipblaslt_gemm``).
Each takes its library for the inputs it is built for and hands every other input
to the Triton kernel it replaces: a Python-level check, no device synchronisation.

- gemm: torch's linear, which ROCm builds of torch run on hipBLASLt;
- scaled_gemm: torch._scaled_mm (hipBLASLt fp8) with per-tensor scales in the
  architecture's fp8 (float8_e4m3fnuz on gfx942, float8_e4m3fn on gfx950);
- varlen_attention: aiter's CK flash-attention when aiter is installed.

Off under the Triton interpreter, off a GPU, and with ``HETERO_ROCM_VENDOR=0``.
Nothing here imports aiter at module level.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import inspect
import os
from typing import Any, Callable

import torch

from hetero.kernels.torch_paths import linear_gemm, named

__all__ = ["ENV", "off_reason", "bind", "installed", "hipblaslt_gemm", "torch_scaled_gemm", "aiter_varlen"]

ENV = "HETERO_ROCM_VENDOR"
_SCALED_MM_FP8 = {
    "gfx940": torch.float8_e4m3fnuz,
    "gfx941": torch.float8_e4m3fnuz,
    "gfx942": torch.float8_e4m3fnuz,
    "gfx950": torch.float8_e4m3fn,
}
_CK_DTYPES = (torch.float16, torch.bfloat16)


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
    """aiter's version ("not installed"), without importing it."""
    if importlib.util.find_spec("aiter") is None:
        return {"aiter": "not installed"}
    try:
        return {"aiter": md.version("aiter")}
    except md.PackageNotFoundError:
        return {"aiter": "installed"}


def bind(backend: Any) -> dict[str, Callable]:
    """The vendor implementations for ``backend`` (a RocmBackend on a real GPU), each wrapping its Triton op."""
    paths: dict[str, Callable] = {"gemm": hipblaslt_gemm(backend.gemm)}
    fp8 = _SCALED_MM_FP8.get(backend.gfx or "")
    if fp8 is not None and hasattr(torch, "_scaled_mm"):
        paths["scaled_gemm"] = torch_scaled_gemm(backend.scaled_gemm, fp8)
    ck = _aiter_varlen_func()
    if ck is not None:
        paths["varlen_attention"] = aiter_varlen(backend.varlen_attention, ck)
    return paths


def hipblaslt_gemm(triton_gemm: Callable) -> Callable:
    """torch's linear (hipBLASLt on ROCm) when operands, bias and output share a dtype."""
    return linear_gemm(triton_gemm, "hipblaslt_gemm", __name__)


def _tensorwise(a, b, a_scale, b_scale, fp8: torch.dtype) -> bool:
    return (
        a.dtype is fp8
        and b.dtype is fp8
        and a.shape[0] > 0
        and a.shape[1] % 16 == 0
        and b.shape[0] % 16 == 0
        and a.is_contiguous()
        and b.is_contiguous()
        and a_scale.numel() == 1
        and b_scale.numel() == 1
        and a_scale.dtype is torch.float32
        and b_scale.dtype is torch.float32
    )


def torch_scaled_gemm(triton_scaled_gemm: Callable, fp8: torch.dtype) -> Callable:
    """torch._scaled_mm (hipBLASLt) for per-tensor scales in the architecture's fp8; the rest to the Triton kernel."""

    def scaled_gemm(a, b, a_scale, b_scale, *, bias=None, out_dtype=torch.bfloat16):
        if not _tensorwise(a, b, a_scale, b_scale, fp8):
            return triton_scaled_gemm(a, b, a_scale, b_scale, bias=bias, out_dtype=out_dtype)
        mm_dtype = out_dtype if bias is None else torch.float32  # bias in float32, one rounding
        out = torch._scaled_mm(a, b.t(), scale_a=a_scale.reshape(()), scale_b=b_scale.reshape(()), out_dtype=mm_dtype)
        return out if bias is None else out.add_(bias).to(out_dtype)

    return named(scaled_gemm, "torch_scaled_gemm")


def _aiter_varlen_func() -> Callable | None:
    """aiter.flash_attn_varlen_func when aiter imports and takes return_lse, else None."""
    if importlib.util.find_spec("aiter") is None:
        return None
    try:
        import aiter

        fn = aiter.flash_attn_varlen_func
        params = inspect.signature(fn).parameters
    except Exception:  # a broken or JIT-less install must not break the backend
        return None
    return fn if {"return_lse", "window_size", "softmax_scale"} <= set(params) else None


def _ck_fits(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, softcap: float) -> bool:
    d = query.shape[-1]
    return (
        softcap == 0.0
        and query.dtype in _CK_DTYPES
        and key.dtype == query.dtype
        and value.dtype == query.dtype
        and value.shape[-1] == d
        and d % 8 == 0
        and d <= 256
        and query.shape[0] > 0
        and key.shape[0] > 0
    )


def aiter_varlen(triton_varlen: Callable, ck_varlen: Callable) -> Callable:
    """aiter's CK varlen flash-attention (fp16/bf16, D == Dv <= 256, no softcap); LSE [H, T] -> [T, H], +inf -> -inf."""

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
        if not _ck_fits(query, key, value, softcap):
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
        res = ck_varlen(
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
            return_lse=return_lse,
        )
        out = res[0] if isinstance(res, (tuple, list)) else res
        if not return_lse:
            return out
        lse = res[1].t().contiguous()
        return out, lse.masked_fill_(lse == float("inf"), float("-inf"))

    return named(varlen_attention, "aiter_varlen")
