"""MXFP4 (OCP microscaling FP4) weights, dequantized at load: gpt-oss's released expert tensors.

A ``*_blocks`` tensor holds two e2m1 values per byte (low nibble first), 16 bytes = 32 values per block;
its ``*_scales`` tensor one e8m0 exponent per block: ``value = e2m1[nibble] * 2 ** (scale - 127)``
(transformers' ``integrations/mxfp4.py``). The engine has no MXFP4 expert op, so the experts run on the
dequantized weights in the model dtype (exact: every MXFP4 value is a float of a few bits).
"""

from __future__ import annotations

import torch

__all__ = ["E2M1_VALUES", "MXFP4_BLOCK", "dequantize_mxfp4"]

#: the 16 e2m1 codes: sign bit 3, then exponent and mantissa
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
#: values per e8m0 scale
MXFP4_BLOCK = 32


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """blocks uint8 [..., G, 16] and scales uint8 [..., G] -> [..., G * 32] in ``dtype``."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks and scales are uint8, got {blocks.dtype} and {scales.dtype}")
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != MXFP4_BLOCK // 2:
        raise ValueError(
            f"MXFP4 blocks {tuple(blocks.shape)} do not fit scales {tuple(scales.shape)} "
            f"(blocks are [..., G, {MXFP4_BLOCK // 2}] for scales [..., G])"
        )
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=blocks.device)
    out = torch.empty(*scales.shape[:-1], scales.shape[-1] * MXFP4_BLOCK, dtype=dtype, device=blocks.device)
    if scales.ndim == 1:
        return _dequantize_into(out, blocks, scales, lut)
    for i in range(scales.shape[0]):  # one expert at a time: the float32 temporaries stay one expert's size
        _dequantize_into(out[i], blocks[i], scales[i], lut)
    return out


def _dequantize_into(out: torch.Tensor, blocks: torch.Tensor, scales: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    values = torch.stack([lut[(blocks & 0x0F).int()], lut[(blocks >> 4).int()]], dim=-1).flatten(-2)
    out.copy_(torch.ldexp(values, scales.to(torch.int32).unsqueeze(-1) - 127).flatten(-2))
    return out
