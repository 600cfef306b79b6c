"""Reference quantized ops (spec 1.4): dynamic activation quantization and the quantized grouped GEMM.

``quantize_activation`` is the spec's formula literally, group by group in float32 (also for
float64 inputs: the spec rounds x to float32 first), so every backend can match it bit for bit.
``scaled_grouped_gemm`` works like ``scaled_gemm``: per group, the quantized product of each
K-block is accumulated unscaled (exactly, in integers, for int8), then scaled and summed over the
blocks, in float32, or float64 when a scale is float64 (the oracle's fused_moe run).
"""

from __future__ import annotations

import torch

from hetero.spec.checks import check_group_ends, check_quantize_inputs, check_scaled_grouped, scale_blocks
from hetero.spec.gemm import AMAX_FLOOR, QMAX, SCALE_BLOCK

__all__ = ["quantize_activation", "scaled_grouped_gemm", "scaled_grouped_product", "expand_b_scale", "ue8m0"]

#: The reference takes float64 scales too (the oracle widens float32 tensors).
SCALE_DTYPES = (torch.float32, torch.float64)


def ue8m0(s: torch.Tensor) -> torch.Tensor:
    """The smallest power of two >= s (s > 0, float32), exactly: frexp gives s = m * 2**e, m in [0.5, 1)."""
    mantissa, exponent = torch.frexp(s)
    exponent = exponent - (mantissa == 0.5).to(exponent.dtype)  # s already a power of two
    return torch.ldexp(torch.ones_like(s), exponent)


def _round_int8(y: torch.Tensor) -> torch.Tensor:
    return torch.round(y).clamp(-128, 127)  # torch.round: half to even


def _symmetric(xg: torch.Tensor, dtype: torch.dtype, scale_fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    qmax = QMAX[dtype]
    floor = torch.tensor(AMAX_FLOOR, dtype=torch.float32)
    amax = torch.maximum(xg.abs().amax(dim=1, keepdim=True), floor)
    s = amax / qmax
    if scale_fmt == "ue8m0":
        s = ue8m0(s)
    y = (xg / s).clamp(-qmax, qmax)
    q = _round_int8(y).to(dtype) if dtype == torch.int8 else y.to(dtype)  # fp8: round to nearest even
    return q, s


def _asymmetric(xg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    floor = torch.tensor(AMAX_FLOOR, dtype=torch.float32)
    zero = torch.zeros((), dtype=xg.dtype)
    lo, hi = torch.minimum(xg.amin(dim=1, keepdim=True), zero), torch.maximum(xg.amax(dim=1, keepdim=True), zero)
    s = torch.maximum(hi - lo, floor) / 255.0
    zp = _round_int8(-128.0 - lo / s)
    q = (torch.round(xg / s) + zp).clamp(-128, 127)
    return q.to(torch.int8), s, zp.to(torch.int32)


def quantize_activation(
    x: torch.Tensor,
    *,
    dtype: torch.dtype,
    group_size: int | None = 128,
    scale_fmt: str = "float",
    asymmetric: bool = False,
) -> tuple[torch.Tensor, ...]:
    op = "quantize_activation"
    rows, k, groups = check_quantize_inputs(op, x, dtype, group_size, scale_fmt, asymmetric)
    width = k if group_size is None else int(group_size)
    xf = x.to(torch.float32)
    q = torch.empty(rows, k, dtype=dtype, device=x.device)
    scale = torch.empty(rows, groups, dtype=torch.float32, device=x.device)
    zero_point = torch.empty(rows, groups, dtype=torch.int32, device=x.device)
    for g in range(groups):
        cols = slice(g * width, min((g + 1) * width, k))
        if asymmetric:
            q[:, cols], s, zero_point[:, g : g + 1] = _asymmetric(xf[:, cols])
        else:
            q[:, cols], s = _symmetric(xf[:, cols], dtype, scale_fmt)
        scale[:, g : g + 1] = s
    return (q, scale, zero_point) if asymmetric else (q, scale)


def _expand_a_scale(a_scale: torch.Tensor, form: str, rows: int, kblocks: int, acc: torch.dtype) -> torch.Tensor:
    """a_scale as [rows, kblocks]: entry [r, j] covers row r and K-block j."""
    s = a_scale.to(acc)
    if form == "tensor":
        return s.reshape(1, 1).expand(rows, kblocks)
    return s.expand(rows, kblocks) if form == "row" else s


def expand_b_scale(scale: torch.Tensor, form: str, n: int, kblocks: int, acc: torch.dtype) -> torch.Tensor:
    """One group's weight scale (a row of a grouped b_scale) as [n, kblocks]: entry [c, j] covers
    output channel c and K-block j (kblocks 1 unless the form is "block")."""
    s = scale.to(acc)
    if form == "group":
        return s.reshape(1, 1).expand(n, kblocks)
    if form == "row":
        return s.expand(n, kblocks)
    return s.repeat_interleave(SCALE_BLOCK, dim=0)[:n]


def _raw_product(a: torch.Tensor, b: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """a @ b.T of the quantized (or zero-point shifted int8) values, unscaled, in ``acc``: fp8 products
    are exact and summed in ``acc``; integers summed exactly (each 128-column chunk is below 2**24)."""
    if a.is_floating_point():  # fp8
        return a.to(acc) @ b.to(acc).T
    total = torch.zeros(a.shape[0], b.shape[0], dtype=torch.int64, device=a.device)
    for k0 in range(0, a.shape[1], SCALE_BLOCK):
        total += (a[:, k0 : k0 + SCALE_BLOCK].float() @ b[:, k0 : k0 + SCALE_BLOCK].float().T).to(torch.int64)
    return total.to(acc)


def scaled_grouped_product(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    ends: list[int],
    a_form: str,
    b_form: str,
    a_zero_point: torch.Tensor | None,
) -> torch.Tensor:
    """scaled_grouped_gemm before its rounding, in float32 (float64 when a scale is float64); checked inputs."""
    acc = torch.float64 if torch.float64 in (a_scale.dtype, b_scale.dtype) else torch.float32
    (m, k), n = a.shape, b.shape[1]
    kblocks = scale_blocks(k) if "block" in (a_form, b_form) else 1
    width = SCALE_BLOCK if kblocks > 1 else k
    sa = _expand_a_scale(a_scale, a_form, m, kblocks, acc)
    av = a if a_zero_point is None else a.to(torch.int32) - a_zero_point
    out = torch.zeros(m, n, dtype=acc, device=a.device)
    start = 0
    for g, end in enumerate(ends):
        if end > start:
            sb = expand_b_scale(b_scale[g], b_form, n, kblocks, acc)
            for j in range(kblocks):
                cols = slice(j * width, (j + 1) * width)
                raw = _raw_product(av[start:end, cols], b[g][:, cols], acc)
                out[start:end] += raw * sa[start:end, j : j + 1] * sb[:, j].unsqueeze(0)
        start = end
    return out


def scaled_grouped_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    group_ends: torch.Tensor,
    *,
    a_zero_point: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    op = "scaled_grouped_gemm"
    a_form, b_form = check_scaled_grouped(op, a, b, a_scale, b_scale, group_ends, a_zero_point, out_dtype, SCALE_DTYPES)
    ends = check_group_ends(op, group_ends, b.shape[0], a.shape[0])
    return scaled_grouped_product(a, b, a_scale, b_scale, ends, a_form, b_form, a_zero_point).to(out_dtype)
