"""Glue ops from torch's batched operators: rms_norm (plain, zero-centred, residual, gated),
layer_norm, rotary_embedding (neox and interleaved, partial rotary), silu_and_mul.

Semantics: ``hetero.spec.layers``. Each op computes in float32 (float64 when an input is float64)
and rounds to the input's dtype where the spec says; inputs are never modified. On a CPU in
float32 or bfloat16, rms_norm without a gate, silu_and_mul and rotary_embedding (float32 table)
run hetero-torch's native kernels (``_layers_native``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hetero.errors import OpError
from hetero.spec.checks import check_at_least_1d, check_layer_norm, check_rms_norm, check_rotary
from hetero.spec.layers import check_rms_norm_options
from hetero.spec.types import FLOAT_DTYPES
from hetero_torch import _layers_native as native
from hetero_torch._layers_util import acc_dtype

__all__ = ["rms_norm", "layer_norm", "rotary_embedding", "silu_and_mul"]

_GATE_ACTS = {"silu": F.silu, "sigmoid": torch.sigmoid}


def _normalize(
    h: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    acc: torch.dtype,
    offset: float,
    gate: torch.Tensor | None,
    gate_act: str,
) -> torch.Tensor:
    """rms_norm of h in ``acc`` times (weight + offset); with ``gate`` the spec's r(r(r(xn) * w) * act(gate))."""
    a = h.to(acc)
    xn = a * torch.rsqrt(a.square().mean(dim=-1, keepdim=True) + eps)
    w = weight.to(acc)
    if offset:
        w = w + offset
    if gate is None:
        return (xn * w).to(h.dtype)
    y = (xn.to(h.dtype).to(acc) * w).to(h.dtype).to(acc)
    return (y * _GATE_ACTS[gate_act](gate.to(acc))).to(h.dtype)


def rms_norm(x, weight, eps, *, residual=None, weight_offset=0.0, gate=None, gate_act="silu"):
    op = "rms_norm"
    check_rms_norm(op, x, weight, eps, residual)
    check_rms_norm_options(op, x, residual, weight_offset, gate, gate_act)
    if gate is None and native.norm_applies(x, weight, residual):
        return native.rms_norm(x, weight, float(eps), residual, float(weight_offset))
    acc = acc_dtype(x, weight, residual, gate)
    if residual is None:
        return _normalize(x, weight, float(eps), acc, float(weight_offset), gate, gate_act)
    h = torch.add(x.to(acc), residual.to(acc)).to(x.dtype)
    return _normalize(h, weight, float(eps), acc, float(weight_offset), None, gate_act), h


def layer_norm(x, weight, bias, eps):
    check_layer_norm("layer_norm", x, weight, bias, eps)
    acc = acc_dtype(x, weight, bias)
    a = x.to(acc)
    b = None if bias is None else bias.to(acc)
    return F.layer_norm(a, (a.shape[-1],), weight.to(acc), b, float(eps)).to(x.dtype)


def _rotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot: int, is_neox: bool, acc: torch.dtype
) -> torch.Tensor:
    """x [T, H, D] with its first ``rot`` dims rotated; cos/sin [T, 1, rot/2] in ``acc``."""
    part = x[..., :rot].to(acc)
    if is_neox:
        x1, x2 = part.chunk(2, dim=-1)
    else:
        x1, x2 = part[..., 0::2], part[..., 1::2]
    new1 = x1 * cos - x2 * sin
    new2 = x2 * cos + x1 * sin
    rotated = torch.cat((new1, new2), dim=-1) if is_neox else torch.stack((new1, new2), dim=-1).flatten(-2)
    rotated = rotated.to(x.dtype)
    if rot == x.shape[-1]:
        return rotated
    return torch.cat((rotated, x[..., rot:]), dim=-1)


def rotary_embedding(positions, q, k, cos_sin_cache, *, is_neox=True):
    # positions are range-checked by the registry when validation is on; unchecked, they are clamped
    # into the cache's rows (undefined results, no read outside it, no host sync)
    _, _, max_pos, rot = check_rotary("rotary_embedding", positions, q, k, cos_sin_cache, is_neox, read_positions=False)
    if native.rotary_applies(positions, q, k, cos_sin_cache):
        return native.rotary_embedding(positions, q, k, cos_sin_cache, is_neox)
    acc = acc_dtype(q, k, cos_sin_cache)
    rows = cos_sin_cache.index_select(0, positions.clamp(0, max_pos - 1)).to(acc)  # [T, rot]
    cos, sin = rows.unsqueeze(1).chunk(2, dim=-1)
    return _rotate(q, cos, sin, rot, is_neox, acc), _rotate(k, cos, sin, rot, is_neox, acc)


def silu_and_mul(x):
    op = "silu_and_mul"
    check_at_least_1d(op, "x", x, FLOAT_DTYPES)
    width = x.shape[-1]
    if not (width % 2 == 0):
        raise OpError(op, "x", "an even last dimension (2I)", f"shape {list(x.shape)}")
    if native.act_applies(x):
        return native.silu_and_mul(x)
    a = x.to(acc_dtype(x))
    gate, up = a.chunk(2, dim=-1)
    return (F.silu(gate) * up).to(x.dtype)
