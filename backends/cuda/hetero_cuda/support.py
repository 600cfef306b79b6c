"""What the cuda backend runs natively: dtypes per compute capability and the Triton kernels' shape limits.

``reason(op, static, capability)`` is the body of ``CudaBackend.supports``: None
when the op runs natively for that static configuration, else one sentence
saying why not (an engine records it; conformance reports the case as skipped).
``capability`` is None under the Triton interpreter (no architecture to check).
"""

from __future__ import annotations

from typing import Any, Mapping

from hetero.kernels.limits import MAX_HEAD_DIM, QUANT_OPS, dtype_name, dtype_reason, quant_dtype, shape_reason

__all__ = ["reason", "dtype_name", "sm_name", "MAX_HEAD_DIM"]

MIN_BF16, MIN_FP8 = (8, 0), (8, 9)


def sm_name(capability: tuple[int, int]) -> str:
    return f"sm{capability[0]}{capability[1]}"


def _fp8_reason(dtype: str, cap: tuple[int, int] | None) -> str | None:
    if dtype == "float8_e4m3fnuz":
        return (
            f"float8_e4m3fnuz is AMD's fp8 (MI300); "
            f"{sm_name(cap) + ' uses' if cap else 'NVIDIA GPUs use'} float8_e4m3fn"
        )
    if dtype == "float8_e4m3fn" and cap is not None and cap < MIN_FP8:
        return f"float8_e4m3fn needs sm89+ (fp8 tensor cores), this device is {sm_name(cap)}"
    return None


def _arch_reason(op: str, dtype: str, cap: tuple[int, int] | None) -> str | None:
    if op in QUANT_OPS:
        return _fp8_reason(dtype, cap)
    if dtype == "bfloat16" and cap is not None and cap < MIN_BF16:
        return f"bfloat16 needs sm80+, this device is {sm_name(cap)}"
    return None


def reason(op: str, static: Mapping[str, Any], capability: tuple[int, int] | None) -> str | None:
    """None if ``op`` runs natively with ``static`` (dtype=..., head_dim=..., block_size=...), else why not."""
    dtype = dtype_name(static.get("dtype"))
    if dtype is not None:
        why = dtype_reason(op, dtype) or _arch_reason(op, dtype, capability)
        if why:
            return why
    weights = quant_dtype(op, static) if op == "fused_moe" else None
    if weights is not None and weights.startswith("float8"):
        why = _fp8_reason(weights, capability)
        if why:
            return why
    return shape_reason(op, static)
