"""Inputs of the recurrent cases (causal_conv1d, gated_delta_rule), and their static options."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from hetero.verify.inputs.draw import randn
from hetero.verify.inputs.recurrent_draw import Linear, Seq, batch, gates, nan_fill, qkv

__all__ = ["conv", "conv_static", "gdr", "gdr_static"]


def _tokens(index: dict[str, torch.Tensor]) -> int:
    return int(index["query_start_loc"][-1])


def conv(
    lin: Linear,
    seqs: Sequence[Seq],
    *,
    width: int | None = None,
    bias: bool = False,
    activation: str | None = "silu",
    view: bool = False,
):
    """causal_conv1d over [T, C] with C = 2*H*K + HV*V. ``view``: x is the q|k|v columns of a
    q|k|v|z projection (Qwen3-Next's fused in_proj_qkvz), rows strided."""
    w, c = width or lin.width, lin.channels

    def build(gen: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        index, num_slots, nan = batch(gen, seqs)
        t = _tokens(index)
        x = randn(gen, (t, c + (lin.hv * lin.v if view else 0)), dtype)[:, :c]
        return {
            "x": x if view else x.contiguous(),
            "weight": randn(gen, (c, w), dtype, 0.5),
            "bias": randn(gen, (c,), dtype) if bias else None,
            "conv_state": nan_fill(randn(gen, (num_slots, w - 1, c), dtype), nan),
            **index,
            "activation": activation,
        }

    return build


def gdr(lin: Linear, seqs: Sequence[Seq], *, views: bool = True, beta_f32: bool = False, l2norm: bool = True):
    """gated_delta_rule. ``views``: q, k, v strided views of the conv output; ``beta_f32``: beta in
    float32 (Kimi computes it there) instead of the case dtype (Qwen3-Next's sigmoid(b)). With
    whole-model heads (a slot of 0.5-1M floats) no spare slot is added: the sequences' own slots,
    in random order, already show a write to the wrong one."""
    spare = 1 if lin.hv * lin.k * lin.v <= 1 << 17 else 0

    def build(gen: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        index, num_slots, nan = batch(gen, seqs, spare)
        t = _tokens(index)
        q, k, v = qkv(gen, lin, t, dtype, views, normalized=not l2norm)
        state = nan_fill(randn(gen, (num_slots, lin.hv, lin.k, lin.v), torch.float32, 0.1), nan)
        return {
            "q": q,
            "k": k,
            "v": v,
            **gates(gen, lin, t, torch.float32 if beta_f32 else dtype),
            "ssm_state": state,
            **index,
            "scale": lin.k**-0.5,
            "use_qk_l2norm": l2norm,
        }

    return build


def conv_static(dt: str, lin: Linear, width: int | None = None, bias: bool = False, activation: str | None = "silu"):
    return {"dtype": dt, "channels": lin.channels, "width": width or lin.width, "bias": bias, "activation": activation}


def gdr_static(dt: str, lin: Linear, l2norm: bool = True):
    return {
        "dtype": dt,
        "num_heads": lin.h,
        "head_dim": lin.k,
        "num_v_heads": lin.hv,
        "head_dim_v": lin.v,
        "g_per_key": lin.kda,
        "use_qk_l2norm": l2norm,
    }
