"""What the portable Triton kernels compute, whatever the chip: dtype families and shape limits.

``kernel_reason(op, static)`` is ``TritonBackend.supports``; a vendor backend adds
its architecture's own limits (bf16 or fp8 support per generation) in front of it.
"""

from __future__ import annotations

from typing import Any, Mapping

from hetero.spec.moe import ACTIVATIONS, SCORING

__all__ = [
    "dtype_name",
    "dtype_reason",
    "shape_reason",
    "kernel_reason",
    "quant_dtype",
    "MAX_HEAD_DIM",
    "MAX_KEY_DIM",
    "FLOATS",
    "QUANTS",
    "DOT_OPS",
    "QUANT_OPS",
    "PACKED",
]

#: The attention kernels pad head dims to a power of two; 576 (MLA: 512 latent + 64 rope) is the largest case.
MAX_HEAD_DIM = 576
FLOATS = ("float16", "bfloat16", "float32", "float64")
QUANTS = ("float8_e4m3fn", "float8_e4m3fnuz", "int8")
#: Ops whose kernels multiply with tl.dot (tensor or matrix cores): no float64 path there.
DOT_OPS = frozenset(
    {
        "paged_attention",
        "varlen_attention",
        "mla_attention",
        "gemm",
        "grouped_gemm",
        "fused_moe",
        "gated_delta_rule",
        "indexer_topk",
        "compressed_attention",
    }
)
#: Names of packed int4 weights (spec 1.9) in a static configuration (``weight_dtype``): gemm, grouped_gemm
#: and fused_moe run them in ``hetero.kernels.int4``, any group size, with or without zero points.
PACKED = ("uint8", "int4")
#: Ops whose operands are quantized (``dtype`` names the quantized dtype).
QUANT_OPS = frozenset({"scaled_gemm", "scaled_grouped_gemm"})
#: The gated_delta_rule kernels keep whole key rows in registers (every released model has K = 128).
MAX_KEY_DIM = 256


def dtype_name(dtype: Any) -> str | None:
    """ "bfloat16" for torch.bfloat16, "torch.bfloat16" or "bfloat16"; None for None."""
    return None if dtype is None else str(dtype).removeprefix("torch.")


def dtype_reason(op: str, dtype: str) -> str | None:
    """None if the kernels of ``op`` take ``dtype`` at all, else why not."""
    if op in QUANT_OPS:
        return None if dtype in QUANTS else f"{op} takes {', '.join(QUANTS)} operands, not {dtype}"
    if dtype in QUANTS:
        return f"{op} takes floating tensors; {dtype} operands go through scaled_gemm"
    if dtype not in FLOATS:
        return f"{op} takes {', '.join(FLOATS)} tensors, not {dtype}"
    if dtype == "float64" and op in DOT_OPS:
        return f"the Triton {op} kernel has no float64 matrix-core path (float64 is the reference's dtype)"
    return None


def quant_dtype(op: str, static: Mapping[str, Any]) -> str | None:
    """The quantized dtype an op's static configuration names: ``dtype`` of the scaled GEMMs,
    ``quant_dtype`` of quantize_activation, the weights' of a quantized fused_moe; else None."""
    if op in QUANT_OPS:
        return dtype_name(static.get("dtype"))
    for key in ("quant_dtype", "weight_dtype", "w_dtype"):
        if static.get(key) is not None:
            return dtype_name(static[key])
    return None


def shape_reason(op: str, static: Mapping[str, Any]) -> str | None:
    """None if the static shapes and options of ``op`` are within the kernels' limits, else why not."""
    for key in ("head_dim", "head_dim_v"):
        value = static.get(key)
        if value is not None and int(value) > MAX_HEAD_DIM:
            return f"{key} {int(value)} > {MAX_HEAD_DIM} unsupported by the Triton {op} kernel"
        if value is not None and int(value) < 1:
            return f"{key} {int(value)} is not a head dimension"
    block_size = static.get("block_size")
    if block_size is not None and int(block_size) < 1:
        return f"block_size {int(block_size)}: a KV block holds at least one token"
    if op == "fused_moe" and static.get("activation", "silu") not in ACTIVATIONS:
        return f"the fused_moe kernel applies {', '.join(ACTIVATIONS)}, not {static['activation']!r}"
    quant = quant_dtype(op, static) if op in ("quantize_activation", "fused_moe") else None
    if op == "fused_moe" and quant in PACKED:  # W4A16 experts (spec 1.9): weight-only, nothing quantized
        quant = None
    if quant is not None and quant not in QUANTS and (op == "quantize_activation" or quant not in FLOATS):
        return f"the {op} kernels quantize to {', '.join(QUANTS)}, not {quant}"
    if op == "route" and static.get("scoring", "softmax") not in SCORING:
        return f"route scores with {', '.join(SCORING)}, not {static['scoring']!r}"
    if op == "gated_delta_rule":
        for key in ("head_dim", "head_dim_k", "key_head_dim"):
            value = static.get(key)
            if value is not None and int(value) > MAX_KEY_DIM:
                return (
                    f"{key} {int(value)} > {MAX_KEY_DIM}: the gated_delta_rule kernels keep whole key rows in registers"
                )
    return None


def kernel_reason(op: str, static: Mapping[str, Any]) -> str | None:
    """None if the portable kernels run ``op`` for ``static`` (dtype=..., head_dim=..., ...), else why not."""
    dtype = dtype_name(static.get("dtype"))
    return (dtype_reason(op, dtype) if dtype is not None else None) or shape_reason(op, static)
