"""The arithmetic of the torch backend's quantized ops: quantize_activation's pinned formula over
every group at once, and the scaled products (raw quantized product then scales where the scales are
constant over K; dequantized operands in float32 where a scale is 128-block-wise)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hetero.spec.gemm import AMAX_FLOOR, QMAX, SCALE_BLOCK
from hetero_torch._gemm_grouped import grouped_matmul, row_groups, used_groups

__all__ = ["quantize", "scaled_product", "scaled_grouped_product", "dequant_b"]


def _ue8m0(s: torch.Tensor) -> torch.Tensor:
    """The smallest power of two >= s (s > 0), exactly: frexp gives s = m * 2**e, m in [0.5, 1)."""
    mantissa, exponent = torch.frexp(s)
    exponent = exponent - (mantissa == 0.5).to(exponent.dtype)
    return torch.ldexp(torch.ones_like(s), exponent)


def quantize(
    x: torch.Tensor, dtype: torch.dtype, group_size: int | None, ue8m0: bool, asymmetric: bool
) -> tuple[torch.Tensor, ...]:
    """(q [M, K], scale float32 [M, G][, zero_point int32 [M, G]]) of checked inputs, per spec.

    Rows are padded with zeros to whole groups: a zero changes neither |x|'s maximum nor the
    asymmetric range (which always holds 0)."""
    rows, k = x.shape
    width = k if group_size is None else int(group_size)
    groups = -(-k // width) if k else 0
    xf = x.to(torch.float32)
    if groups * width != k:
        xf = F.pad(xf, (0, groups * width - k))
    xg = xf.reshape(rows, groups, width)
    floor = torch.tensor(AMAX_FLOOR, dtype=torch.float32, device=x.device)
    if asymmetric:
        zero = torch.zeros((), dtype=torch.float32, device=x.device)
        lo = torch.minimum(xg.amin(dim=-1, keepdim=True), zero)
        hi = torch.maximum(xg.amax(dim=-1, keepdim=True), zero)
        s = torch.maximum(hi - lo, floor) / 255.0
        zp = torch.round(-128.0 - lo / s).clamp(-128, 127)
        q = (torch.round(xg / s) + zp).clamp(-128, 127).to(torch.int8)
        return q.reshape(rows, groups * width)[:, :k], s.squeeze(-1), zp.squeeze(-1).to(torch.int32)
    qmax = QMAX[dtype]
    s = torch.maximum(xg.abs().amax(dim=-1, keepdim=True), floor) / qmax
    if ue8m0:
        s = _ue8m0(s)
    y = (xg / s).clamp(-qmax, qmax)
    q = torch.round(y).clamp(-128, 127).to(dtype) if dtype == torch.int8 else y.to(dtype)
    return q.reshape(rows, groups * width)[:, :k], s.squeeze(-1)


def _pad_to_blocks(x: torch.Tensor, dims: int) -> torch.Tensor:
    """x with its last ``dims`` dimensions zero-padded to whole 128-blocks."""
    pad: list[int] = []
    for size in reversed(x.shape[-dims:]):
        pad += [0, -size % SCALE_BLOCK]
    return F.pad(x, pad) if any(pad) else x


def _block_dequant(x: torch.Tensor, scale: torch.Tensor, acc: torch.dtype, dims: int) -> torch.Tensor:
    """x [..., K] (dims 1: scale [..., KB]) or [..., N, K] (dims 2: scale [..., NB, KB]) times the
    scale of the 128-block covering each entry, in acc; the scale broadcasts, never widened."""
    xp = _pad_to_blocks(x.to(acc), dims)
    s = scale.to(acc)
    blocks = xp.unflatten(-1, (-1, SCALE_BLOCK))
    if dims == 2:
        blocks, s = blocks.unflatten(-3, (-1, SCALE_BLOCK)), s.unsqueeze(-2)
    s = s.unsqueeze(-1)
    blocks = blocks.mul_(s) if xp.data_ptr() != x.data_ptr() else blocks * s  # scale a fresh copy in place
    out = blocks.flatten(-2) if dims == 1 else blocks.flatten(-2).flatten(-3, -2)
    return out[..., : x.shape[-1]] if dims == 1 else out[..., : x.shape[-2], : x.shape[-1]]


def _a_dequant(
    a: torch.Tensor, a_scale: torch.Tensor, form: str, zp: torch.Tensor | None, acc: torch.dtype
) -> torch.Tensor:
    """dequant(a) [M, K] in acc."""
    av = a.to(acc) if zp is None else (a.to(torch.int32) - zp).to(acc)
    if form == "block":
        return _block_dequant(av, a_scale, acc, 1)
    s = a_scale.to(acc)
    return av * (s.reshape(()) if form == "tensor" else s)


def scaled_product(
    a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor, a_form: str, b_form: str
) -> torch.Tensor:
    """scaled_gemm before its bias and rounding, float32 [M, N]; checked inputs."""
    acc = torch.float32
    if "block" in (a_form, b_form):
        if b_form == "block":
            bd = _block_dequant(b, b_scale, acc, 2)
        else:
            bd = b.to(acc) * b_scale.to(acc).reshape(-1, 1)
        return F.linear(_a_dequant(a, a_scale, a_form, None, acc), bd)
    raw = F.linear(a.to(acc), b.to(acc))  # int8: integer sums, exact in float32 below 2**24
    sa = a_scale.reshape(()) if a_form == "tensor" else a_scale
    sb = b_scale.reshape(()) if b_form == "tensor" else b_scale.reshape(1, -1)
    return raw * sa * sb


def scaled_grouped_product(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    group_ends: torch.Tensor,
    ends: list[int],
    forms: tuple[str, str],
    zp: torch.Tensor | None,
) -> torch.Tensor:
    """scaled_grouped_gemm before its rounding, in float32 (float64 when a scale is float64); checked inputs."""
    a_form, b_form = forms
    acc = torch.float64 if torch.float64 in (a_scale.dtype, b_scale.dtype) else torch.float32
    b, b_scale, group_ends, ends = used_groups(b, b_scale, ends)
    m, groups = a.shape[0], b.shape[0]
    if groups == 0:
        return torch.zeros(m, b.shape[1], dtype=acc, device=a.device)
    if "block" in forms:
        bd = dequant_b(b, b_scale, b_form, acc)
        return grouped_matmul(_a_dequant(a, a_scale, a_form, zp, acc), bd, group_ends, ends, acc)
    av = a.to(acc) if zp is None else (a.to(torch.int32) - zp).to(acc)
    raw = grouped_matmul(av, b.to(acc), group_ends, ends, acc)
    sa = a_scale.to(acc).reshape(()) if a_form == "tensor" else a_scale.to(acc)
    group = row_groups(group_ends, m).clamp(max=groups - 1)  # rows past the last end are zero already
    sb = b_scale.to(acc).reshape(groups, -1)  # [G, 1] or [G, N]
    return raw * sa * sb.index_select(0, group)


def dequant_b(b: torch.Tensor, b_scale: torch.Tensor, form: str, acc: torch.dtype) -> torch.Tensor:
    """dequant(b) [G, N, K] in acc for a grouped b_scale: "group" [G], "row" [G, N, 1] or "block"."""
    if form == "block":
        return _block_dequant(b, b_scale, acc, 2)
    s = b_scale.to(acc)
    return b.to(acc) * (s.reshape(-1, 1, 1) if s.ndim == 1 else s)
