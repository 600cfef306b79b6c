"""What the torch backend's layers, GEMM and MoE families decline, per device.

They compute everything by widening to float32 (float64 for float64 inputs), so a device declines
only a dtype its torch cannot hold or widen: MPS has no float8 or float64 tensors. On a device
(unlike the CPU) indexing is not bounds-checked by torch, so these ops range-check expert ids,
perm, positions and group_ends on the host before any indexing (which synchronizes).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from hetero.kernels.limits import dtype_name

__all__ = ["DENSE_OPS", "dense_reason"]

DENSE_OPS = frozenset(
    {
        "rms_norm",
        "layer_norm",
        "rotary_embedding",
        "silu_and_mul",
        "gemm",
        "grouped_gemm",
        "scaled_gemm",
        "quantize_activation",
        "scaled_grouped_gemm",
        "route",
        "moe_permute",
        "moe_unpermute",
        "fused_moe",
    }
)
_NO_MPS = ("float8_e4m3fn", "float8_e4m3fnuz", "float64")


def dense_reason(op: str, static: Mapping[str, Any], device: torch.device) -> str | None:
    """None when ``op`` runs on ``device`` with ``static``, else why not."""
    if device.type != "mps":
        return None
    for key, value in static.items():  # dtype, quant_dtype, weight_dtype, w13_dtype, ...
        if isinstance(value, (str, torch.dtype)) and dtype_name(value) in _NO_MPS:
            return f"{op}: torch's mps device has no {dtype_name(value)} tensors ({key})"
    return None
