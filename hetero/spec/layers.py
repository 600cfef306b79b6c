"""Glue operators around attention and the MLP: normalization, rotary embedding, gated activation."""
from __future__ import annotations

import torch

from hetero.spec._op import Output, spec_op

__all__ = ["rms_norm", "rotary_embedding", "silu_and_mul"]


@spec_op(returns=("out", Output("residual", when="residual")))
def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Root-mean-square normalization, optionally fused with the residual add.

    x [T, H] (or any [..., H]), weight [H]; computed in float32 or wider and
    rounded once to x's dtype: ``y = x * rsqrt(mean(x**2, -1) + eps) * weight``.
    With ``residual`` (x's shape and dtype): ``h = x + residual`` rounded to x's
    dtype, and the result is ``(rms_norm(h), h)``; the caller keeps ``h`` as the
    next residual.
    """


@spec_op(returns=("q", "k"))
def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    *,
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the first ``rot`` dims of every query and key head by its position's angles.

    positions int64 [T], each in [0, P); q [T, Hq, D], k [T, Hkv, D];
    cos_sin_cache [P, rot] (float32 or q's dtype) holds ``cos`` in columns
    [0, rot/2) and ``sin`` in [rot/2, rot); rot is even and <= D (dims past rot
    pass through: partial rotary). Pair i (of rot/2) is dims (i, i + rot/2) when
    ``is_neox`` (GPT-NeoX, Llama, Qwen), dims (2i, 2i+1) otherwise (GPT-J,
    DeepSeek's interleaved rope): ``(x1, x2) -> (x1*cos - x2*sin, x2*cos + x1*sin)``.
    Returns new (q, k) in their dtypes, computed in float32 or wider.
    """


@spec_op(returns=("out",))
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """The gated activation of SwiGLU MLPs: ``silu(x[..., :I]) * x[..., I:]``.

    x [T, 2I] (or any [..., 2I]); computed in float32 or wider, returns [T, I] in x's dtype.
    """
