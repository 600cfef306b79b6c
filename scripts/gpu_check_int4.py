"""The packed int4 (W4A16, spec 1.9) cases of scripts/gpu_check.py: Kimi-K2.5's experts (symmetric, group 32;
DeepSeek-V3's shapes with 384 experts) and Qwen3-30B-A3B's as AWQ / GPTQ ship them (zero points, group 128).

- gemm: a shared-expert-shaped gate_up (N 2I, K H) at one decode token and a T-token prefill.
- grouped_gemm: Kimi-K2's gate_up under expert parallelism 8 (E / 8 local experts, T x top_k / 8 rows).
- fused_moe: both models' experts at the decode and batch token counts of the bfloat16 MoE cases.

Bytes: the activations in bfloat16, the packed weights at half a byte a weight with their float32 scales
(and uint8 zero points) of the experts that receive tokens only, every output once. The roofline takes
the bfloat16 rate: the products run on the 16-bit matrix cores.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from gpu_check_sizes import Bench, Sizes, expert_ids, nbytes, randn

__all__ = ["int4_benches"]

EP = 8  # the grouped case's expert parallelism


def packed(lead: tuple[int, ...], n: int, k: int, group: int, zero_point: bool, device) -> dict[str, torch.Tensor]:
    """A packed int4 weight [*lead, n, ceil(k/2)], its scales (float32, std-1/sqrt(k)-sized weights) and zero
    points (uint8, or None)."""
    groups = math.ceil(k / group)
    return {
        "w": torch.randint(0, 256, (*lead, n, (k + 1) // 2), dtype=torch.uint8, device=device),
        "scale": torch.rand(*lead, n, groups, device=device).add_(0.5).mul_(0.3 * k**-0.5),
        "zp": torch.randint(6, 11, (*lead, n, groups), dtype=torch.uint8, device=device) if zero_point else None,
    }


def _size(p: dict[str, torch.Tensor | None], experts: int = 1) -> float:
    """Bytes of ``experts`` of the packed weight's leading entries (all of it when it has no expert dim)."""
    whole = nbytes(*(t for t in p.values() if t is not None))
    lead = p["w"].shape[0] if p["w"].ndim == 3 else 1
    return whole * experts / lead


def _gemm(m: int, n: int, k: int, group: int, zero_point: bool) -> Callable:
    def make(dev):
        a, p = randn((m, k), dev), packed((), n, k, group, zero_point, dev)
        inputs = {"a": a, "b": p["w"], "b_scale": p["scale"], "b_zero_point": p["zp"], "group_size": group}
        return inputs, 2.0 * m * n * k, nbytes(a) + _size(p) + m * n * 2

    return make


def _grouped(t: int, e: int, k: int, h: int, i: int, group: int) -> Callable:
    local, rows = max(1, e // EP), max(1, t * k // EP)

    def make(dev):
        a, p = randn((rows, h), dev), packed((local,), 2 * i, h, group, False, dev)
        ends = torch.linspace(0, rows, local + 1)[1:].round().to(torch.int32).to(dev)  # balanced local experts
        inputs = {"a": a, "b": p["w"], "group_ends": ends, "b_scale": p["scale"], "group_size": group}
        return inputs, 2.0 * rows * 2 * i * h, nbytes(a, ends) + _size(p) + rows * 2 * i * 2

    return make


def _fused(t: int, e: int, k: int, h: int, i: int, group: int, zero_point: bool) -> Callable:
    def make(dev):
        x, ids = randn((t, h), dev), expert_ids(t, e, k, dev)
        p13, p2 = packed((e,), 2 * i, h, group, zero_point, dev), packed((e,), h, i, group, zero_point, dev)
        used = int(torch.unique(ids).numel()) if dev.type != "meta" else min(e, t * k)
        weights = torch.rand(t, k, device=dev)
        inputs = {
            "x": x,
            "w13": p13["w"],
            "w2": p2["w"],
            "weights": weights,
            "ids": ids,
            "w13_scale": p13["scale"],
            "w2_scale": p2["scale"],
            "w13_zero_point": p13["zp"],
            "w2_zero_point": p2["zp"],
            "group_size": group,
        }
        moved = _size(p13, used) + _size(p2, used) + 2 * nbytes(x) + nbytes(ids, weights)
        return inputs, 2.0 * t * k * 3 * i * h, moved

    return make


def int4_benches(s: Sizes) -> list[Bench]:
    """gemm, grouped_gemm and fused_moe on packed int4 weights at Kimi-K2's and Qwen3-30B-A3B's shapes."""
    out = []
    for model, (e, k, h, i, group) in s.w4a16.items():
        zp = model != "kimi-k2"  # Kimi's release is symmetric; AWQ / GPTQ carry zero points
        form = f"W4A16 g{group}{' zp' if zp else ''}"
        for m in (1, s.quant_tokens):
            out.append(
                Bench("gemm", f"{model} gate_up {form} T{m} N{2 * i} K{h}", "bfloat16", _gemm(m, 2 * i, h, group, zp))
            )
        for t in s.moe_tokens:
            out.append(
                Bench(
                    "fused_moe",
                    f"{model} {form} T{t} E{e} top{k} H{h} I{i}",
                    "bfloat16",
                    _fused(t, e, k, h, i, group, zp),
                )
            )
    e, k, h, i, group = s.w4a16["kimi-k2"]
    t = s.quant_tokens
    name = f"kimi-k2 EP{EP} gate_up W4A16 g{group} E{max(1, e // EP)} rows{max(1, t * k // EP)} N{2 * i} K{h}"
    return out + [Bench("grouped_gemm", name, "bfloat16", _grouped(t, e, k, h, i, group))]
