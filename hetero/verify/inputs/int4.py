"""Inputs of the packed int4 (W4A16, spec 1.9) cases of gemm, grouped_gemm and fused_moe.

Weights are drawn as a group-wise 4-bit quantizer leaves them: per row and group a scale of
log-normal spread (so that a wrong group's scale shows), codes bell-shaped around the group's zero
point (8 when symmetric; a per-group value near 8 when asymmetric) and clamped to [0, 15], packed two
a byte with the even column in the low nibble. With an odd K the unused high nibble of a row's last
byte holds a random code, which a correct implementation ignores. Scales make the dequantized
weights std ~ gain/sqrt(K), so outputs are of order 1.
"""

from __future__ import annotations

import math

import torch

from hetero.verify.inputs.draw import randn
from hetero.verify.inputs.fused_moe import expert_ids, expert_pool, routing_weights
from hetero.verify.inputs.gemm import _group_ends

__all__ = ["pack", "weights", "gemm", "grouped", "fused"]

#: The spread of the codes around the zero point (in code steps): a symmetric quantizer's amax / 7 scale
#: puts a normal weight's std near 2.3 steps.
CODE_STD = 2.3


def pack(q: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Codes [..., K] in [0, 15] as uint8 [..., ceil(K/2)], the even column in the low nibble; with an odd
    K the last byte's high nibble is a random code (ignored by the spec)."""
    k = q.shape[-1]
    if k % 2:
        junk = torch.randint(0, 16, (*q.shape[:-1], 1), generator=gen, dtype=q.dtype)
        q = torch.cat([q, junk], dim=-1)
    q = q.to(torch.uint8)
    return q[..., 0::2] | (q[..., 1::2] << 4)


def weights(
    gen: torch.Generator, lead: tuple[int, ...], n: int, k: int, group_size: int, zero_point: bool, gain: float = 1.0
) -> dict[str, torch.Tensor]:
    """{"w": uint8 [*lead, N, ceil(K/2)], "scale": float32 [*lead, N, ceil(K/g)], "zp": uint8 or absent}."""
    groups = -(-k // group_size)
    scale = (gain / (CODE_STD * math.sqrt(k))) * torch.exp(0.5 * torch.randn(*lead, n, groups, generator=gen))
    if zero_point:  # asymmetric: each group's range is off-centre, so its zero point is too
        zp = (8 + torch.randn(*lead, n, groups, generator=gen) * 2.5).round().clamp(0, 15).to(torch.uint8)
        centre = zp.to(torch.float32)
    else:
        zp, centre = None, torch.full((*lead, n, groups), 8.0)
    centre = centre.repeat_interleave(group_size, dim=-1)[..., :k]
    q = (torch.randn(*lead, n, k, generator=gen) * CODE_STD + centre).round().clamp(0, 15).to(torch.int32)
    out = {"w": pack(q, gen), "scale": scale.float().contiguous()}
    if zp is not None:
        out["zp"] = zp
    return out


def gemm(
    m: int,
    n: int,
    k: int,
    group_size: int,
    *,
    zero_point: bool = False,
    bias: bool = False,
    bias_dtype: torch.dtype | None = None,
    out_dtype: torch.dtype | None = None,
):
    """gemm with a packed b [n, ceil(k/2)]; a bias of a's dtype (or ``bias_dtype``) when ``bias``."""

    def build(gen: torch.Generator, dtype: torch.dtype):
        wq = weights(gen, (), n, k, group_size, zero_point)
        args = {"a": randn(gen, (m, k), dtype), "b": wq["w"], "b_scale": wq["scale"], "group_size": group_size}
        if zero_point:
            args["b_zero_point"] = wq["zp"]
        if bias:
            args["bias"] = randn(gen, (n,), bias_dtype or dtype, 0.5)
        if out_dtype is not None:
            args["out_dtype"] = out_dtype
        return args

    return build


def grouped(
    rows: int,
    groups: int,
    n: int,
    k: int,
    group_size: int,
    *,
    zero_point: bool = False,
    tail: int = 0,
    empty: tuple[int, ...] = (),
    only: int | None = None,
    out_dtype: torch.dtype | None = None,
):
    """grouped_gemm with packed b [groups, n, ceil(k/2)]; ``tail`` rows past the last group (zero out)."""

    def build(gen: torch.Generator, dtype: torch.dtype):
        ends = _group_ends(gen, rows, groups, tuple(g % groups for g in empty), only)
        wq = weights(gen, (groups,), n, k, group_size, zero_point)
        args = {
            "a": randn(gen, (rows + tail, k), dtype),
            "b": wq["w"],
            "group_ends": ends,
            "b_scale": wq["scale"],
            "group_size": group_size,
        }
        if zero_point:
            args["b_zero_point"] = wq["zp"]
        if out_dtype is not None:
            args["out_dtype"] = out_dtype
        return args

    return build


def fused(
    m: int,
    e: int,
    k: int,
    h: int,
    inter: int,
    group_size: int,
    unused: tuple[int, ...],
    *,
    zero_point: bool = False,
    bias: bool = False,
):
    """fused_moe with packed experts w13 [e, 2*inter, ceil(h/2)], w2 [e, h, ceil(inter/2)] (silu)."""

    def build(gen: torch.Generator, dtype: torch.dtype):
        w13 = weights(gen, (e,), 2 * inter, h, group_size, zero_point)
        w2 = weights(gen, (e,), h, inter, group_size, zero_point)
        args = {
            "x": randn(gen, (m, h), dtype),
            "w13": w13["w"],
            "w2": w2["w"],
            "weights": routing_weights(gen, m, k),
            "ids": expert_ids(gen, m, k, expert_pool(e, unused)),
            "w13_scale": w13["scale"],
            "w2_scale": w2["scale"],
            "group_size": group_size,
        }
        if zero_point:
            args["w13_zero_point"], args["w2_zero_point"] = w13["zp"], w2["zp"]
        if bias:
            args["w13_bias"], args["w2_bias"] = randn(gen, (e, 2 * inter), dtype, 0.5), randn(gen, (e, h), dtype, 0.1)
        return args

    return build
