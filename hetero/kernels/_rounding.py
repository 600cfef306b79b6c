"""Rounding a kernel's float32 result to its output dtype the way a GPU does, under the interpreter too.

Triton 3.9's interpreter converts float32 to bfloat16 by truncation where a GPU rounds
to nearest even, so bf16 outputs go through :func:`cast_out` (exact emulation under the
interpreter, a plain cast on a device). Shared by the layer kernels
(``hetero.kernels._layer_kernels``) and the cache kernels (``hetero.kernels.cache``).
"""

from __future__ import annotations

import torch

from hetero.kernels._triton import interpreter_requested, triton_modules
from hetero.kernels.tuning import Tuning

triton, tl = triton_modules()

__all__ = ["cast_out", "rne_bf16"]


@triton.jit
def cast_out(x, DST: tl.constexpr, RNE_BF16: tl.constexpr):
    """``x.to(DST)``. With RNE_BF16 (set under the interpreter when DST is bfloat16) the float32 ->
    bfloat16 rounding is done by hand, to nearest even as a GPU's convert does: triton 3.9's
    interpreter truncates instead, which would make the interpreter's bf16 results differ
    from the GPU's by up to one ulp (and break the exact ``h = x + residual`` of rms_norm)."""
    if RNE_BF16:
        xf = x.to(tl.float32)
        bits = xf.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        y = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        return tl.where(xf != xf, xf.to(tl.bfloat16), y)  # NaN stays NaN
    else:
        return x.to(DST)


def rne_bf16(dtype: torch.dtype, tuning: Tuning) -> bool:
    """The RNE_BF16 flag of ``cast_out`` for an output of ``dtype``: bfloat16 under the interpreter
    (harmless elsewhere: the emulation is bit-exact, only slower)."""
    return dtype == torch.bfloat16 and (tuning.interpreted or interpreter_requested())
