"""Inputs of the quantized-op cases (spec 1.4): LLM-like activations with edge rows, and operands
quantized with each scale form of ``scaled_grouped_gemm`` (amax / qmax, the checkpoints' rule)."""

from __future__ import annotations

import math

import torch

from hetero.verify.inputs.draw import randn

__all__ = ["activations", "ties", "quantize_rows", "quantize_weights", "BLOCK"]

BLOCK = 128  # hetero.spec.gemm.SCALE_BLOCK
_QMAX = {torch.float8_e4m3fn: 448.0, torch.float8_e4m3fnuz: 224.0, torch.int8: 127.0}


def activations(gen: torch.Generator, m: int, k: int, dtype: torch.dtype, edge: str = "") -> torch.Tensor:
    """x [m, k]: per-channel magnitudes vary (log-normal), a few 10x outlier channels; ``edge``:
    "zero_row" (row 1 all zeros: the amax floor), "huge" (row 0 near 1e4 times larger, row 1 of 1e-12:
    below the floor), "constant" (row 0 one value repeated: hi == lo for asymmetric)."""
    chan = torch.exp(0.6 * torch.randn(k, generator=gen))
    chan[torch.randperm(k, generator=gen)[: max(1, k // 256)]] *= 10
    x = randn(gen, (m, k), torch.float32) * chan
    if edge == "zero_row" and m > 1:
        x[1] = 0.0
    if edge == "huge" and m > 1:
        x[0] *= 1e4 if dtype == torch.float16 else 1e30
        x[1] *= 1e-12
    if edge == "constant" and m > 0:
        x[0] = -0.75
    return x.to(dtype)


def ties(gen: torch.Generator, m: int, k: int, qdtype: torch.dtype, dtype: torch.dtype) -> torch.Tensor:
    """x [m, k] whose quotients x / s fall exactly halfway between two values of qdtype (ties).

    Each row holds qmax * 2**-5 (so s = 2**-5 exactly, a power of two) and midpoints of adjacent
    representable values times 2**-5, both signs; every value is exact in bfloat16 and float16.
    """
    qmax = _QMAX[qdtype]
    if qdtype == torch.int8:
        grid = torch.arange(-127, 127, dtype=torch.float32) + 0.5
    else:
        pos = torch.arange(0, 256, dtype=torch.uint8).view(qdtype).float()
        pos = pos[torch.isfinite(pos) & (pos >= 0) & (pos <= qmax)].unique()
        mid = (pos[:-1] + pos[1:]) / 2
        grid = torch.cat([mid, -mid])
    pick = grid[torch.randint(0, len(grid), (m, k), generator=gen)]
    pick[:, 0] = qmax
    return (pick * 2.0**-5).to(dtype)


def _rounded(y: torch.Tensor, qdtype: torch.dtype) -> torch.Tensor:
    return y.round().to(qdtype) if qdtype == torch.int8 else y.to(qdtype)


def quantize_rows(x: torch.Tensor, qdtype: torch.dtype, form: str, zero_point: bool = False):
    """Activations x float32 [M, K] -> (q, a_scale, a_zero_point or None): form "block" [M, ceil(K/128)],
    "row" [M, 1] or "tensor" ([1]); zero_point: asymmetric int8 per token."""
    qmax, (m, k) = _QMAX[qdtype], x.shape
    if zero_point:
        lo, hi = x.amin(dim=1, keepdim=True).clamp_max(0), x.amax(dim=1, keepdim=True).clamp_min(0)
        s = (hi - lo).clamp_min(1e-10) / 255
        zp = (-128 - lo / s).round().clamp(-128, 127)
        q = ((x / s).round() + zp).clamp(-128, 127).to(torch.int8)
        return q, s.float(), zp.to(torch.int32)
    if form == "tensor":
        s = (x.abs().amax().clamp_min(1e-10) / qmax).reshape(1)
        full = s.reshape(1, 1)
    elif form == "row":
        s = full = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-10) / qmax
    else:
        kb = -(-k // BLOCK)
        pad = torch.nn.functional.pad(x.abs(), (0, kb * BLOCK - k))
        s = pad.reshape(m, kb, BLOCK).amax(dim=2).clamp_min(1e-10) / qmax
        full = s.repeat_interleave(BLOCK, dim=1)[:, :k]
    return _rounded((x / full).clamp(-qmax, qmax), qdtype), s.float().contiguous(), None


def _weight_scale(w: torch.Tensor, form: str, qmax: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One expert's scale in ``form`` and its expansion to [N, K]."""
    n, k = w.shape
    if form == "group":
        s = w.abs().amax().clamp_min(1e-10) / qmax
        return s.reshape(()), s.reshape(1, 1)
    if form == "row":
        s = w.abs().amax(dim=1, keepdim=True).clamp_min(1e-10) / qmax
        return s, s
    nb, kb = -(-n // BLOCK), -(-k // BLOCK)
    pad = torch.nn.functional.pad(w.abs(), (0, kb * BLOCK - k, 0, nb * BLOCK - n))
    s = pad.reshape(nb, BLOCK, kb, BLOCK).amax(dim=(1, 3)).clamp_min(1e-10) / qmax
    return s, s.repeat_interleave(BLOCK, dim=0)[:n].repeat_interleave(BLOCK, dim=1)[:, :k]


def quantize_weights(
    gen: torch.Generator, groups: int, n: int, k: int, qdtype: torch.dtype, form: str, gain: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert weights [G, N, K] of a trained layer (std gain/sqrt(K), per channel and column-block
    magnitudes varying) quantized with scales of ``form``: "block" [G, ceil(N/128), ceil(K/128)],
    "row" [G, N, 1] or "group" [G]."""
    qmax = _QMAX[qdtype]
    qs, ss = [], []
    for _ in range(groups):
        rowmag = torch.exp(0.4 * torch.randn(n, 1, generator=gen))
        colmag = torch.exp(0.4 * torch.randn(1, -(-k // BLOCK), generator=gen)).repeat_interleave(BLOCK, dim=1)[:, :k]
        w = torch.randn(n, k, generator=gen) * (gain / math.sqrt(k)) * rowmag * colmag  # an exact 0 is harmless here
        s, full = _weight_scale(w, form, qmax)
        qs.append(_rounded((w / full).clamp(-qmax, qmax), qdtype))
        ss.append(s)
    return torch.stack(qs), torch.stack(ss).float().contiguous()
