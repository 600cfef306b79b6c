"""Packed int4 weights (spec 1.9, W4A16) in the torch backend: gemm, grouped_gemm and fused_moe on
weights dequantized by ``hetero.spec.gemm``'s formula, whole tensors at a time.

Dequantization is bit-exact to the spec: the nibbles are split by two bitwise ops, the codes and zero
points are small integers (exact in float32), and ``(q - zp) * scale`` is one float32 product. The
float32 weights then go through the products the float paths use (float32 accumulation, float64 for
the oracle's float64 activations, one rounding to the output dtype). Grouped weights are dequantized
only for the groups that own rows: a decode step routes to a few of hundreds of experts. Arguments
are checked by the callers, but for the expert ids, which are range-checked here before any indexing.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from hetero.spec.checks import check_ids
from hetero_torch._gemm_grouped import grouped_matmul
from hetero_torch._layers_util import acc_dtype
from hetero_torch._opaque import opaque

__all__ = ["dequantize", "int4_gemm", "int4_grouped_gemm", "int4_fused_moe"]

#: The zero point of a weight without one (symmetric).
SYMMETRIC_ZERO_POINT = 8.0


def dequantize(
    b: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None, group_size: int, k: int
) -> torch.Tensor:
    """float32 [..., N, K] of a packed uint8 b [..., N, ceil(K/2)]: ``float32(q - zp) * scale`` per group."""
    codes = torch.stack((b & 0xF, b >> 4), dim=-1).flatten(-2)  # even columns from the low nibbles
    groups = scale.shape[-1]
    codes = F.pad(codes[..., :k], (0, groups * group_size - k)).to(torch.float32)
    codes = codes.unflatten(-1, (groups, group_size))  # [..., N, groups, g]
    zp = SYMMETRIC_ZERO_POINT if zero_point is None else zero_point.to(torch.float32).unsqueeze(-1)
    w = (codes - zp) * scale.to(torch.float32).unsqueeze(-1)  # exact difference, one float32 rounding
    return w.flatten(-2)[..., :k]


def int4_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None,
    group_size: int,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """``a @ w.T + bias`` in float32 (float64 for float64 a), rounded once to out_dtype."""
    acc = acc_dtype(a)
    w = dequantize(b, scale, zero_point, group_size, a.shape[1]).to(acc)
    return F.linear(a.to(acc), w, None if bias is None else bias.to(acc)).to(out_dtype)


def _owners(ends: list[int]) -> list[int]:
    """The groups that own rows."""
    return [g for g, (start, end) in enumerate(zip([0] + ends[:-1], ends)) if end > start]


def _grouped_acc(
    a: torch.Tensor,
    b: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None,
    group_size: int,
    ends: list[int],
) -> torch.Tensor:
    """Rows [ends[g-1], ends[g]) of ``a @ w[g].T`` in float32 (float64 for float64 a), unrounded; rows
    past the last group zero. Only the groups that own rows are dequantized."""
    acc = acc_dtype(a)
    keep = _owners(ends)
    if not keep:
        return torch.zeros(a.shape[0], b.shape[1], dtype=acc, device=a.device)
    index = torch.tensor(keep, dtype=torch.int64, device=b.device)
    pick = lambda t: None if t is None else t.index_select(0, index)  # noqa: E731
    w = dequantize(pick(b), pick(scale), pick(zero_point), group_size, a.shape[1]).to(acc)
    kept = [ends[g] for g in keep]
    kept_t = torch.tensor(kept, dtype=torch.int32, device=a.device)
    return grouped_matmul(a.to(acc), w, kept_t, kept, acc)


def int4_grouped_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None,
    group_size: int,
    ends: list[int],
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """grouped_gemm on packed weights: each group's ``a @ w[g].T`` rounded once to out_dtype."""
    return _grouped_acc(a, b, scale, zero_point, group_size, ends).to(out_dtype)


def _expert_linear(
    a: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None,
    group_size: int,
    bias: torch.Tensor | None,
    expert: torch.Tensor,
    ends: list[int],
) -> torch.Tensor:
    """Row r of ``a @ w[expert[r]].T + bias[expert[r]]`` (bias added unrounded), rounded once to a's dtype."""
    y = _grouped_acc(a, w, scale, zero_point, group_size, ends)
    if bias is not None:
        y = y + bias.to(y.dtype).index_select(0, expert)
    return y.to(a.dtype)


def _experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    activation: str,
    alpha: float,
    limit: float | None,
    w13_bias: torch.Tensor | None,
    w2_bias: torch.Tensor | None,
    w13_scale: torch.Tensor,
    w2_scale: torch.Tensor,
    w13_zero_point: torch.Tensor | None,
    w2_zero_point: torch.Tensor | None,
    group_size: int,
) -> torch.Tensor:
    """fused_moe on packed int4 experts, its arguments checked but for the ids' values (checked here)."""
    from hetero_torch.moe import _activation, _sort_pairs, _unpermute  # the float path's glue; moe imports us

    check_ids("fused_moe", ids, x.shape[0], w13.shape[0])
    k = ids.shape[1]
    perm, group_ends = _sort_pairs(ids, w13.shape[0])
    ends = group_ends.tolist()
    x_sorted = x.index_select(0, perm // k)
    expert = ids.reshape(-1).long().index_select(0, perm)
    act = functools.partial(_activation, activation=activation, alpha=alpha, limit=limit)
    gate_up = _expert_linear(x_sorted, w13, w13_scale, w13_zero_point, group_size, w13_bias, expert, ends)
    y_sorted = _expert_linear(act(gate_up), w2, w2_scale, w2_zero_point, group_size, w2_bias, expert, ends)
    return _unpermute(y_sorted, perm, weights)


# one opaque op under torch.compile, as the float path's: the ids and group ends are read on the host
_experts_op = opaque("fused_moe_int4", _experts, lambda x, *args: torch.empty_like(x))


def int4_fused_moe(*args: object) -> torch.Tensor:
    """fused_moe on packed int4 experts (``_experts``' arguments), one opaque op when compiled."""
    run = _experts_op if torch.compiler.is_compiling() else _experts
    return run(*args)
