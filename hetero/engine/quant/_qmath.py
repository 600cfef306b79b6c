"""Weight (de)quantization math of the scaled formats: 128x128 blocks and per-channel scales.

Shared by the loader's methods (``scaled``), ``hetero quantize`` and the tests' dequantized
oracle checkpoints, so all three read a scale the same way. Scale grids are ceil-div: the
last block row or column of a weight whose size is not a multiple of 128 covers the
remaining elements only (DeepSeek-V3's ``kv_a_proj_with_mqa``, 576 rows).
"""

from __future__ import annotations

import torch

__all__ = [
    "BLOCK",
    "FP8",
    "QUANT_DTYPES",
    "qmax",
    "block_grid",
    "dequantize",
    "quantize_blocks",
    "quantize_channels",
    "float_scale",
    "e4m3fn_to_fnuz",
]

#: edge of a weight scale block
BLOCK = 128
FP8 = torch.float8_e4m3fn
#: the weight dtypes of the scaled formats
QUANT_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.int8)


def qmax(dtype: torch.dtype) -> float:
    """The largest magnitude a weight of ``dtype`` is scaled to (448 for e4m3fn, 127 for int8)."""
    return 127.0 if dtype == torch.int8 else float(torch.finfo(dtype).max)


def block_grid(rows: int, cols: int, block: int = BLOCK) -> tuple[int, int]:
    """The scale grid of a [rows, cols] weight: (ceil(rows/block), ceil(cols/block))."""
    return -(-rows // block), -(-cols // block)


def float_scale(scale: torch.Tensor) -> torch.Tensor:
    """A checkpoint scale (float32, bfloat16 or float16) as float32; anything else is refused."""
    if scale.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"weight scales are float32, bfloat16 or float16, got {scale.dtype}")
    return scale.to(torch.float32)


def dequantize(
    weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32, block: int = BLOCK
) -> torch.Tensor:
    """``weight [..., N, K]`` (fp8 or int8) times its scale, in ``dtype``.

    The scale's shape says its form: [..., ceil(N/block), ceil(K/block)] blocks, [..., N, 1] per
    output channel, or one element per tensor (or per leading index: [...]).
    """
    n, k = weight.shape[-2:]
    s = float_scale(scale)
    if s.shape[-2:] == (n, 1):
        full = s
    elif s.ndim == weight.ndim and s.shape[-2:] == block_grid(n, k, block):
        full = s.repeat_interleave(block, dim=-2)[..., :n, :].repeat_interleave(block, dim=-1)[..., :k]
    elif s.numel() == 1 or s.shape == weight.shape[:-2]:
        full = s.reshape(*weight.shape[:-2], 1, 1) if s.numel() > 1 else s.reshape(())
    else:
        raise ValueError(
            f"a scale of shape {tuple(s.shape)} fits no scale form of a weight of shape {tuple(weight.shape)} "
            f"(blocks {block_grid(n, k, block)}, per channel ({n}, 1), per tensor)"
        )
    return (weight.to(torch.float32) * full).to(dtype)


def _quantize(w: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    m = qmax(dtype)
    q = (w / scale).clamp(-m, m)
    return q.round().to(dtype) if dtype == torch.int8 else q.to(dtype)


def quantize_blocks(
    weight: torch.Tensor, dtype: torch.dtype = FP8, block: int = BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [N, K], scale float32 [ceil(N/block), ceil(K/block)]): each block's scale is the amax of its own
    elements (a partial block's actual ones) over qmax; an all-zero block gets scale 1."""
    w = weight.to(torch.float32)
    n, k = w.shape
    gn, gk = block_grid(n, k, block)
    padded = w.new_zeros(gn * block, gk * block)
    padded[:n, :k] = w
    amax = padded.abs().view(gn, block, gk, block).amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / qmax(dtype), torch.ones_like(amax))
    full = scale.repeat_interleave(block, 0)[:n].repeat_interleave(block, 1)[:, :k]
    return _quantize(w, full, dtype), scale


def quantize_channels(weight: torch.Tensor, dtype: torch.dtype = FP8) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [N, K], scale float32 [N, 1]): one scale per output row, amax over qmax (all-zero row: 1)."""
    w = weight.to(torch.float32)
    amax = w.abs().amax(dim=1, keepdim=True)
    scale = torch.where(amax > 0, amax / qmax(dtype), torch.ones_like(amax))
    return _quantize(w, scale, dtype), scale


def e4m3fn_to_fnuz(weight: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same values as e4m3fnuz (AMD MI300) weights: the bit patterns kept but 0x80 (-0 in e4m3fn, NaN in
    e4m3fnuz) made 0, and the scales doubled (e4m3fnuz's exponent bias is one more: each pattern means half).
    The engine applies it where a backend's GEMM declines e4m3fn and runs e4m3fnuz (``quant.scaled``)."""
    if weight.dtype != torch.float8_e4m3fn:
        raise ValueError(f"expected float8_e4m3fn weights, got {weight.dtype}")
    bits = weight.view(torch.int8)
    bits = torch.where(bits == -128, torch.zeros_like(bits), bits)
    return bits.view(torch.float8_e4m3fnuz), float_scale(scale) * 2
