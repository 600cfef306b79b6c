"""Packed int4 weights (spec 1.9, W4A16) in the reference: the codes unpacked column by column and
dequantized by ``hetero.spec.gemm``'s formula, then the float products as for float weights.

Written to be read against the spec, not to be fast: each weight is unpacked to one code per column,
each column's group found as ``k // group_size``, and ``w = float32(q - zp) * scale`` evaluated as
written (one float32 rounding). The products accumulate in float32, or in float64 for the oracle's
float64 activations. Arguments are checked by the callers (``gemm``, ``grouped_gemm``, ``fused_moe``).
"""

from __future__ import annotations

import torch

from hetero.spec.checks import check_int4_zero_point_values
from hetero_cpu_ref._util import acc_dtype, up

__all__ = ["unpack_int4", "dequantize_int4", "int4_linear", "int4_grouped_linear", "check_zero_points"]

#: The zero point of a weight without one (symmetric): the middle of the codes 0..15.
SYMMETRIC_ZERO_POINT = 8


def unpack_int4(b: torch.Tensor, k: int) -> torch.Tensor:
    """The codes q [..., K] (int32, in [0, 15]) of a packed uint8 [..., ceil(K/2)]: byte j holds column
    2j in its low nibble and column 2j + 1 in its high nibble (past K: ignored)."""
    low, high = b & 0xF, b >> 4
    return torch.stack((low, high), dim=-1).flatten(-2)[..., :k].to(torch.int32)


def per_column(groups: torch.Tensor, group_size: int, k: int) -> torch.Tensor:
    """A per-group tensor [..., ceil(K/g)] spread to its columns [..., K]: column k takes group k // g."""
    return groups.repeat_interleave(group_size, dim=-1)[..., :k]


def dequantize_int4(
    b: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None, group_size: int, k: int
) -> torch.Tensor:
    """``w[..., n, k] = float32(q[n, k] - zp[n, k // g]) * scale[n, k // g]`` as float32 [..., N, K]."""
    q = unpack_int4(b, k)
    zp = SYMMETRIC_ZERO_POINT if zero_point is None else per_column(zero_point.to(torch.int32), group_size, k)
    s = per_column(scale.to(torch.float32), group_size, k)  # exact: float32 scales (or the oracle's copies)
    return (q - zp).to(torch.float32) * s


def check_zero_points(op: str, *named: tuple[str, torch.Tensor | None]) -> None:
    """Every zero point in [0, 15] (the reference reads them on every call)."""
    for arg, zp in named:
        check_int4_zero_point_values(op, arg, zp)


def int4_linear(
    a: torch.Tensor,
    b: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None,
    group_size: int,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """``a @ w.T + bias`` with w the dequantized b [N, ceil(K/2)], accumulated in float32 (float64 for
    float64 a) and rounded once to out_dtype."""
    acc = acc_dtype(a, bias)
    w = dequantize_int4(b, scale, zero_point, group_size, a.shape[1])
    out = up(a, acc) @ up(w, acc).T
    if bias is not None:
        out = out + up(bias, acc)
    return out.to(out_dtype)


def int4_grouped_linear(
    a: torch.Tensor,
    b: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None,
    group_size: int,
    ends: list[int],
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """Rows [ends[g-1], ends[g]) of ``a @ w[g].T (+ bias[g])``, each group's weight b[g] dequantized
    when it owns rows; rows past the last group are zero."""
    acc = acc_dtype(a)
    out = torch.zeros(a.shape[0], b.shape[1], dtype=out_dtype, device=a.device)
    start = 0
    for g, end in enumerate(ends):
        if end > start:
            zp = None if zero_point is None else zero_point[g]
            w = dequantize_int4(b[g], scale[g], zp, group_size, a.shape[1])
            y = up(a[start:end], acc) @ up(w, acc).T
            out[start:end] = (y if bias is None else y + up(bias[g], acc)).to(out_dtype)
        start = end
    return out
