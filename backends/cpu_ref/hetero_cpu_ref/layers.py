"""Reference glue ops: RMS normalization, rotary embedding, gated SiLU.

Plain PyTorch on whatever device the inputs live on. Each op computes in
float32 (float64 when any input is float64) and rounds once to the input's
dtype; inputs are never modified.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from hetero.spec.checks import check_at_least_1d, check_rms_norm, check_rotary, expect
from hetero.spec.types import FLOAT_DTYPES

from hetero_cpu_ref._util import acc_dtype, up

__all__ = ["rms_norm", "rotary_embedding", "silu_and_mul"]


def _normalize(h: torch.Tensor, weight: torch.Tensor, eps: float, acc: torch.dtype) -> torch.Tensor:
    """rms_norm of h computed in `acc`, rounded once to h's dtype."""
    a = up(h, acc)
    inv_rms = torch.rsqrt(a.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (a * inv_rms * up(weight, acc)).to(h.dtype)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    op = "rms_norm"
    check_rms_norm(op, x, weight, eps, residual)

    acc = acc_dtype(x, weight, residual)
    eps = float(eps)
    if residual is None:
        return _normalize(x, weight, eps, acc)
    h = (up(x, acc) + up(residual, acc)).to(x.dtype)  # the add makes a new tensor
    return _normalize(h, weight, eps, acc), h


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot: int, is_neox: bool, acc: torch.dtype) -> torch.Tensor:
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
