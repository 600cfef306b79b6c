"""What the rocm backend runs natively: fp8 flavours per gfx architecture and the Triton kernels' shape limits.

``reason(op, static, arch)`` is the body of ``RocmBackend.supports``: None when
the op runs natively for that static configuration, else one sentence saying
why not. ``arch`` is None under the Triton interpreter, where both fp8 flavours
run (the interpreter computes either in software).
"""

from __future__ import annotations

from typing import Any, Mapping

from hetero.kernels.limits import MAX_HEAD_DIM, QUANT_OPS, dtype_name, dtype_reason, quant_dtype, shape_reason

__all__ = ["reason", "dtype_name", "FP8_BY_ARCH", "MAX_HEAD_DIM"]

FNUZ, OCP = "float8_e4m3fnuz", "float8_e4m3fn"

#: The fp8 dtypes each architecture's matrix cores compute. MI300 (gfx94x) has the "fnuz" encoding
#: (no negative zero, bias 8); MI350 (gfx950) and RDNA4 (gfx12) have OCP e4m3; CDNA2 and RDNA3 have none.
FP8_BY_ARCH: Mapping[str, tuple[str, ...]] = {
    "gfx940": (FNUZ,),
    "gfx941": (FNUZ,),
    "gfx942": (FNUZ,),
    "gfx950": (OCP, FNUZ),
    "gfx1200": (OCP,),
    "gfx1201": (OCP,),
}
_NAMES = {
    "gfx942": "gfx942 (MI300)",
    "gfx950": "gfx950 (MI350)",
    "gfx90a": "gfx90a (MI200)",
    "gfx908": "gfx908 (MI100)",
}
_NO_BF16 = ("gfx900", "gfx906")  # Vega: no bfloat16 dot instructions


def _fp8_reason(dtype: str, arch: str | None) -> str | None:
    if arch is None or dtype == "int8":
        return None
    native = FP8_BY_ARCH.get(arch, ())
    if dtype in native:
        return None
    name = _NAMES.get(arch, arch)
    if not native:
        return f"{name} has no fp8 matrix instructions; {dtype} runs on gfx942/gfx950"
    if dtype == OCP:
        return f"float8_e4m3fn is OCP fp8; {name} computes float8_e4m3fnuz"
    return f"float8_e4m3fnuz is MI300's fp8; {name} computes float8_e4m3fn"


def _arch_reason(op: str, dtype: str, arch: str | None) -> str | None:
    if op in QUANT_OPS:
        return _fp8_reason(dtype, arch)
    if dtype == "bfloat16" and arch in _NO_BF16:
        return f"bfloat16 needs matrix cores (gfx908+), this device is {arch}"
    return None


def reason(op: str, static: Mapping[str, Any], arch: str | None) -> str | None:
    """None if ``op`` runs natively with ``static`` (dtype=..., head_dim=..., block_size=...), else why not."""
    dtype = dtype_name(static.get("dtype"))
    if dtype is not None:
        why = dtype_reason(op, dtype) or _arch_reason(op, dtype, arch)
        if why:
            return why
    weights = quant_dtype(op, static) if op == "fused_moe" else None
    if weights is not None and weights.startswith("float8"):
        why = _fp8_reason(weights, arch)
        if why:
            return why
    return shape_reason(op, static)
