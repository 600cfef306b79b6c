"""What the rocm backend runs natively: fp8 flavours per gfx architecture and the Triton kernels' shape limits.

``reason(op, static, arch)`` is the body of ``RocmBackend.supports``: None when
the op runs natively for that static configuration, else one sentence saying
why not. ``arch`` is None under the Triton interpreter, where both fp8 flavours
run (the interpreter computes either in software).
"""
from __future__ import annotations

from typing import Any, Mapping

__all__ = ["reason", "dtype_name", "FP8_BY_ARCH", "MAX_HEAD_DIM"]

#: The Triton attention kernels pad head dims to a power of two; 576 (MLA: 512 latent + 64 rope) is the largest case.
MAX_HEAD_DIM = 576
FLOATS = ("float16", "bfloat16", "float32", "float64")
FNUZ, OCP = "float8_e4m3fnuz", "float8_e4m3fn"
QUANTS = (OCP, FNUZ, "int8")
DOT_OPS = frozenset({"paged_attention", "varlen_attention", "mla_attention", "gemm", "grouped_gemm", "fused_moe"})

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
_NAMES = {"gfx942": "gfx942 (MI300)", "gfx950": "gfx950 (MI350)", "gfx90a": "gfx90a (MI200)", "gfx908": "gfx908 (MI100)"}
_NO_BF16 = ("gfx900", "gfx906")  # Vega: no bfloat16 dot instructions


def dtype_name(dtype: Any) -> str | None:
    """"bfloat16" for torch.bfloat16, "torch.bfloat16" or "bfloat16"; None for None."""
    return None if dtype is None else str(dtype).removeprefix("torch.")


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


def _dtype_reason(op: str, dtype: str, arch: str | None) -> str | None:
    if op == "scaled_gemm":
        if dtype not in QUANTS:
            return f"scaled_gemm takes {', '.join(QUANTS)} operands, not {dtype}"
        return _fp8_reason(dtype, arch)
    if dtype in QUANTS:
        return f"{op} takes floating tensors; {dtype} operands go through scaled_gemm"
    if dtype not in FLOATS:
        return f"{op} takes {', '.join(FLOATS)} tensors, not {dtype}"
    if dtype == "float64" and op in DOT_OPS:
        return f"the Triton {op} kernel has no float64 matrix-core path (float64 is the reference's dtype)"
    if dtype == "bfloat16" and arch in _NO_BF16:
        return f"bfloat16 needs matrix cores (gfx908+), this device is {arch}"
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


def reason(op: str, static: Mapping[str, Any], arch: str | None) -> str | None:
    """None if ``op`` runs natively with ``static`` (dtype=..., head_dim=..., block_size=...), else why not."""
    dtype = dtype_name(static.get("dtype"))
    if dtype is not None:
        why = _dtype_reason(op, dtype, arch)
        if why:
            return why
    return _shape_reason(op, static)
