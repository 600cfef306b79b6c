"""Reference glue ops: RMS normalization (plain, zero-centred, gated), layer normalization, rotary
embedding, gated SiLU.

Plain PyTorch on whatever device the inputs live on. Each op computes in
float32 (float64 when any input is float64) and rounds once to the input's
dtype (the gated rms_norm also at the two points the spec names); inputs are
never modified.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hetero.spec.checks import check_at_least_1d, check_layer_norm, check_rms_norm, check_rotary, expect
from hetero.spec.layers import check_rms_norm_options
from hetero.spec.types import FLOAT_DTYPES
from hetero_cpu_ref._util import acc_dtype, up

__all__ = ["rms_norm", "layer_norm", "rotary_embedding", "silu_and_mul"]


_GATE_ACTS = {"silu": F.silu, "sigmoid": torch.sigmoid}


def _normalize(
    h: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    acc: torch.dtype,
    weight_offset: float = 0.0,
    gate: torch.Tensor | None = None,
    gate_act: str = "silu",
) -> torch.Tensor:
    """rms_norm of h computed in `acc` with weight + weight_offset, rounded once to h's dtype; with
    `gate`, the spec's order: r(r(r(xn) * w) * act(gate)), r() rounding to h's dtype."""
    a = up(h, acc)
    xn = a * torch.rsqrt(a.pow(2).mean(dim=-1, keepdim=True) + eps)
    w = up(weight, acc)
    if weight_offset:
        w = w + weight_offset
    if gate is None:
        return (xn * w).to(h.dtype)
    y = (xn.to(h.dtype).to(acc) * w).to(h.dtype).to(acc)
    return (y * _GATE_ACTS[gate_act](up(gate, acc))).to(h.dtype)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    residual: torch.Tensor | None = None,
    weight_offset: float = 0.0,
    gate: torch.Tensor | None = None,
    gate_act: str = "silu",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    op = "rms_norm"
    check_rms_norm(op, x, weight, eps, residual)
    check_rms_norm_options(op, x, residual, weight_offset, gate, gate_act)

    acc = acc_dtype(x, weight, residual, gate)
    eps, offset = float(eps), float(weight_offset)
    if residual is None:
        return _normalize(x, weight, eps, acc, offset, gate, gate_act)
    h = (up(x, acc) + up(residual, acc)).to(x.dtype)  # the add makes a new tensor
    return _normalize(h, weight, eps, acc, offset), h


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    eps: float,
) -> torch.Tensor:
    check_layer_norm("layer_norm", x, weight, bias, eps)
    acc = acc_dtype(x, weight, bias)
    a = up(x, acc)
    centred = a - a.mean(dim=-1, keepdim=True)
    y = centred * torch.rsqrt(centred.pow(2).mean(dim=-1, keepdim=True) + float(eps)) * up(weight, acc)
    if bias is not None:
        y = y + up(bias, acc)
    return y.to(x.dtype)


def _rotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot: int, is_neox: bool, acc: torch.dtype
) -> torch.Tensor:
    """x [T, H, D] with its first `rot` dims rotated; cos/sin [T, 1, rot/2] in `acc`."""
    out = x.to(acc, copy=True)
    part = out[..., :rot]
    half = rot // 2
    if is_neox:
        x1, x2 = part[..., :half], part[..., half:]
    else:
        x1, x2 = part[..., 0::2], part[..., 1::2]
    new1 = x1 * cos - x2 * sin
    new2 = x2 * cos + x1 * sin
    x1.copy_(new1)
    x2.copy_(new2)
    return out.to(x.dtype)


def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    *,
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    _, _, _, rot = check_rotary("rotary_embedding", positions, q, k, cos_sin_cache, is_neox)

    acc = acc_dtype(q, k, cos_sin_cache)
    rows = up(cos_sin_cache.index_select(0, positions), acc)  # [T, rot]
    half = rot // 2
    cos = rows[:, :half].unsqueeze(1)
    sin = rows[:, half:].unsqueeze(1)
    return _rotate(q, cos, sin, rot, is_neox, acc), _rotate(k, cos, sin, rot, is_neox, acc)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    op = "silu_and_mul"
    check_at_least_1d(op, "x", x, FLOAT_DTYPES)
    width = x.shape[-1]
    expect(width % 2 == 0, op, "x", "an even last dimension (2I)", f"shape {list(x.shape)}")
    a = up(x, acc_dtype(x))
    inter = width // 2
    return (F.silu(a[..., :inter]) * a[..., inter:]).to(x.dtype)
