"""Inputs of the fused_moe cases: routed tokens, expert weights (plain or quantized), activation options."""

from __future__ import annotations

import math

import torch

from hetero.verify.inputs.draw import randn
from hetero.verify.inputs.quant_draw import quantize_weights

__all__ = ["ACTS", "CLAMPED", "expert_ids", "expert_pool", "fused", "fused_quant", "routing_weights"]

#: The least share of gate values above the limit, and of up values beyond +-limit, a clamped case draws.
CLAMPED = 0.02
#: activation -> (options, w13 gain): the gain puts gate/up std near 5 (limit 7) and 7 (limit 10).
ACTS = {
    "silu": ({"activation": "silu"}, 1.0),
    "swigluoai": ({"activation": "swigluoai", "alpha": 1.702, "limit": 7.0}, 5.0),
    "swiglu_clamp": ({"activation": "swiglu_clamp", "limit": 10.0}, 7.0),
    "swigluoai-alpha1": ({"activation": "swigluoai", "alpha": 1.0, "limit": 7.0}, 5.0),  # no model: alpha must be read
}


def expert_ids(gen: torch.Generator, m: int, k: int, pool: torch.Tensor) -> torch.Tensor:
    """int32 [m, k]: k distinct experts per token from ``pool``."""
    pick = torch.rand(m, len(pool), generator=gen).argsort(dim=1)[:, :k]
    return pool[pick].to(torch.int32)


def expert_pool(e: int, unused: tuple[int, ...]) -> torch.Tensor:
    """The experts tokens may pick: all but ``unused`` (negative: from the end), which stay empty."""
    drop = {u % e for u in unused}
    return torch.tensor([x for x in range(e) if x not in drop], dtype=torch.int64)


def routing_weights(
    gen: torch.Generator, m: int, k: int, scoring: str = "softmax", factor: float = 1.0
) -> torch.Tensor:
    """float32 [m, k] routing weights as a router returns them: renormalized softmax or sigmoid scores."""
    logits = torch.randn(m, k, generator=gen) * 1.5
    w = logits.softmax(dim=-1) if scoring == "softmax" else logits.sigmoid()
    return (w / w.sum(dim=-1, keepdim=True) * factor).float()


def _check_clamped(args: dict) -> None:
    """Raise unless enough of the pairs' gate / up values (float64, bias included) pass the limit."""
    limit, w13, b13, x, ids = args.get("limit"), args["w13"], args.get("w13_bias"), args["x"], args["ids"]
    if limit is None or x.shape[0] == 0:
        return
    inter, above, beyond, n = w13.shape[1] // 2, 0, 0, 0
    for e in ids.unique().tolist():
        rows = (ids == e).any(dim=1)
        gu = x[rows].double() @ w13[e].double().T + (0 if b13 is None else b13[e].double())
        above += int((gu[:, :inter] > limit).sum())
        beyond += int((gu[:, inter:].abs() > limit).sum())
        n += gu.shape[0] * inter
    if min(above, beyond) < CLAMPED * n:
        raise RuntimeError(f"fused_moe case: only {above} gate and {beyond} up values of {n} pass the limit {limit}")


def fused(
    m: int,
    e: int,
    k: int,
    h: int,
    inter: int,
    unused: tuple[int, ...],
    act: str = "silu",
    bias: bool = False,
    scoring: str = "softmax",
    factor: float = 1.0,
):
    options, gain = ACTS[act]

    def build(gen: torch.Generator, dtype: torch.dtype):
        args = {
            "x": randn(gen, (m, h), dtype),
            "w13": randn(gen, (e, 2 * inter, h), dtype, gain / math.sqrt(h)),
            "w2": randn(gen, (e, h, inter), dtype, 1 / math.sqrt(inter)),
            "weights": routing_weights(gen, m, k, scoring, factor),
            "ids": expert_ids(gen, m, k, expert_pool(e, unused)),
            **options,
        }
        if bias:
            args["w13_bias"], args["w2_bias"] = randn(gen, (e, 2 * inter), dtype), randn(gen, (e, h), dtype)
        _check_clamped(args)
        return args

    return build


def fused_quant(
    m: int,
    e: int,
    k: int,
    h: int,
    inter: int,
    unused: tuple[int, ...],
    qdtype: torch.dtype,
    form: str,
    act_quant: str | None,
    fmt: str = "float",
    bias: bool = False,
):
    """Quantized experts (spec 1.4): weights drawn as trained ones, quantized per scale ``form``."""

    def build(gen: torch.Generator, dtype: torch.dtype):
        w13, s13 = quantize_weights(gen, e, 2 * inter, h, qdtype, form)
        w2, s2 = quantize_weights(gen, e, h, inter, qdtype, form)
        args = {
            "x": randn(gen, (m, h), dtype),
            "w13": w13,
            "w2": w2,
            "weights": routing_weights(gen, m, k),
            "ids": expert_ids(gen, m, k, expert_pool(e, unused)),
            "w13_scale": s13,
            "w2_scale": s2,
            "act_quant": act_quant,
            "act_scale_fmt": fmt,
        }
        if bias:
            args["w13_bias"], args["w2_bias"] = randn(gen, (e, 2 * inter), dtype, 0.5), randn(gen, (e, h), dtype, 0.1)
        return args

    return build
