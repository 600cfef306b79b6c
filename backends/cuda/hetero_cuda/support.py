"""What the cuda backend runs natively: dtypes per compute capability and the Triton kernels' shape limits.

``reason(op, static, capability)`` is the body of ``CudaBackend.supports``: None
when the op runs natively for that static configuration, else one sentence
saying why not (an engine records it; conformance reports the case as skipped).
``capability`` is None under the Triton interpreter (no architecture to check).
"""
from __future__ import annotations

from typing import Any, Mapping

__all__ = ["reason", "dtype_name", "sm_name", "MAX_HEAD_DIM"]

#: The Triton attention kernels pad head dims to a power of two; 576 (MLA: 512 latent + 64 rope) is the largest case.
MAX_HEAD_DIM = 576
FLOATS = ("float16", "bfloat16", "float32", "float64")
QUANTS = ("float8_e4m3fn", "float8_e4m3fnuz", "int8")
#: Ops whose kernels multiply on tensor cores (tl.dot): no float64 path there.
DOT_OPS = frozenset({"paged_attention", "varlen_attention", "mla_attention", "gemm", "grouped_gemm", "fused_moe"})
MIN_BF16, MIN_FP8 = (8, 0), (8, 9)


def dtype_name(dtype: Any) -> str | None:
    """"bfloat16" for torch.bfloat16, "torch.bfloat16" or "bfloat16"; None for None."""
    return None if dtype is None else str(dtype).removeprefix("torch.")


def sm_name(capability: tuple[int, int]) -> str:
    return f"sm{capability[0]}{capability[1]}"


def _fp8_reason(dtype: str, cap: tuple[int, int] | None) -> str | None:
    if dtype == "float8_e4m3fnuz":
        return f"float8_e4m3fnuz is AMD's fp8 (MI300); {sm_name(cap) + ' uses' if cap else 'NVIDIA GPUs use'} float8_e4m3fn"
    if dtype == "float8_e4m3fn" and cap is not None and cap < MIN_FP8:
        return f"float8_e4m3fn needs sm89+ (fp8 tensor cores), this device is {sm_name(cap)}"
    return None


def _dtype_reason(op: str, dtype: str, cap: tuple[int, int] | None) -> str | None:
    if op == "scaled_gemm":
        if dtype not in QUANTS:
            return f"scaled_gemm takes {', '.join(QUANTS)} operands, not {dtype}"
        return _fp8_reason(dtype, cap)
    if dtype in QUANTS:
        return f"{op} takes floating tensors; {dtype} operands go through scaled_gemm"
    if dtype not in FLOATS:
        return f"{op} takes {', '.join(FLOATS)} tensors, not {dtype}"
    if dtype == "float64" and op in DOT_OPS:
        return f"the Triton {op} kernel has no float64 tensor-core path (float64 is the reference's dtype)"
    if dtype == "bfloat16" and cap is not None and cap < MIN_BF16:
        return f"bfloat16 needs sm80+, this device is {sm_name(cap)}"
    return None


def _shape_reason(op: str, static: Mapping[str, Any]) -> str | None:
    for key in ("head_dim", "head_dim_v"):
        value = static.get(key)
        if value is not None and int(value) > MAX_HEAD_DIM:
            return f"{key} {int(value)} > {MAX_HEAD_DIM} unsupported by the Triton {op} kernel"
        if value is not None and int(value) < 1:
            return f"{key} {int(value)} is not a head dimension"
    block_size = static.get("block_size")
    if block_size is not None and int(block_size) < 1:
        return f"block_size {int(block_size)}: a KV block holds at least one token"
    if op == "fused_moe" and static.get("activation", "silu") != "silu":
        return f"the fused_moe kernel applies silu, not {static['activation']!r}"
    if op == "route" and static.get("scoring", "softmax") not in ("softmax", "sigmoid"):
        return f"route scores with softmax or sigmoid, not {static['scoring']!r}"
    return None


def reason(op: str, static: Mapping[str, Any], capability: tuple[int, int] | None) -> str | None:
    """None if ``op`` runs natively with ``static`` (dtype=..., head_dim=..., block_size=...), else why not."""
    dtype = dtype_name(static.get("dtype"))
    if dtype is not None:
        why = _dtype_reason(op, dtype, capability)
        if why:
            return why
    return _shape_reason(op, static)
