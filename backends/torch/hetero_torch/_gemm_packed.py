"""CPU float32 GEMMs through oneDNN's packed weight layout.

At decode-sized row counts, a weight that does not fit in cache is read faster from oneDNN's
blocked layout than by MKL's GEMM from the plain one (1.4-2.7x at 1-64 rows measured on the
build machine, equal at hundreds of rows). A weight seen a second time at the same version
(``Tensor._version``) and address is packed once; the packed copy lives on the tensor itself, so
it goes with the weight, and an in-place update of the weight repacks it. The copy doubles that
weight's memory: ``HETERO_TORCH_PACK_WEIGHTS=0`` turns packing off.
"""
from __future__ import annotations

import os

import torch

__all__ = ["packed_linear", "PACK_WEIGHTS"]

#: whether reused CPU float32 weights are packed (read once, at import)
PACK_WEIGHTS = os.environ.get("HETERO_TORCH_PACK_WEIGHTS", "1") != "0" and torch.backends.mkldnn.is_available()
_ATTR = "_hetero_torch_packed"


def _fits(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> bool:
    return (PACK_WEIGHTS and a.device.type == "cpu" and a.dtype == torch.float32 and b.dtype == torch.float32
            and b.dim() == 2 and b.is_contiguous() and b.numel() > 0 and not b.requires_grad
            and (bias is None or bias.dtype == torch.float32) and not torch.compiler.is_compiling())


def _packed(b: torch.Tensor) -> torch.Tensor | None:
    """b's packed copy; None the first time b is seen at this version (a one-off operand is not packed)."""
    key = (b._version, b.data_ptr(), tuple(b.shape))
    seen = getattr(b, _ATTR, None)
    if seen is None or seen[0] != key:
        setattr(b, _ATTR, (key, None))
        return None
    if seen[1] is None:
        seen = (key, torch.ops.mkldnn._reorder_linear_weight(b, 64))
        setattr(b, _ATTR, seen)
    return seen[1]


def packed_linear(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """a @ b.T (+ bias) from b's packed copy, or None where packing does not apply (then F.linear runs)."""
    if not _fits(a, b, bias):
        return None
    packed = _packed(b)
    if packed is None:
        return None
    return torch.ops.mkldnn._linear_pointwise(a, packed, bias, "none", [], "")
