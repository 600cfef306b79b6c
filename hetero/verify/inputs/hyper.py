"""Inputs of the hyper-connection cases (spec 1.7): hc_pre, hc_post, hc_head.

Streams are drawn with a magnitude per token (uniform in [0.5, 8] times ``magnitude``): a deep
residual's norm is far from 1 and varies by token, so the op's RMS normalization of the mixes
matters. ``fn`` is drawn with std 1/sqrt(N*D), so ``mixes`` (of a normalized token) are of order 1,
and ``scale`` in [0.5, 2] keeps every logit live (the models' initial 0.01 would flatten them all
to the bias). ``strided``: the streams are a slice of a wider buffer (their stride is not D).
"""

from __future__ import annotations

import torch

from hetero.spec.checks import hc_rows
from hetero.verify.inputs.draw import randn, uniform

__all__ = ["hc_pre", "hc_post", "hc_head"]


def _streams(gen: torch.Generator, tokens: int, n: int, d: int, dtype: torch.dtype, magnitude: float, strided: bool):
    per_token = uniform(gen, (tokens, 1, 1), 0.5, 8.0) * magnitude
    s = (randn(gen, (tokens, n, 2 * d if strided else d), torch.float32) * per_token).to(dtype)
    return s[:, :, d:] if strided else s


def _mixing(gen: torch.Generator, rows: int, n: int, d: int, entries: int) -> dict[str, torch.Tensor]:
    return {
        "fn": randn(gen, (rows, n * d), torch.float32, (n * d) ** -0.5),
        "scale": uniform(gen, (entries,), 0.5, 2.0),
        "base": randn(gen, (rows,), torch.float32, 0.5),
    }


def hc_pre(
    tokens: int,
    n: int,
    d: int,
    *,
    sinkhorn_iters: int = 0,
    norm_eps: float = 1e-6,
    hc_eps: float = 1e-6,
    post_mult: float = 2.0,
    post_eps: float = 0.0,
    magnitude: float = 1.0,
    strided: bool = False,
):
    """hc_pre on streams [tokens, n, d]: HY4's form (sinkhorn_iters 0) or DeepSeek-V4's (>= 1)."""
    rows, entries = hc_rows(n, sinkhorn_iters)

    def build(gen: torch.Generator, dtype: torch.dtype):
        return {
            "streams": _streams(gen, tokens, n, d, dtype, magnitude, strided),
            **_mixing(gen, rows, n, d, entries),
            "norm_eps": norm_eps,
            "hc_eps": hc_eps,
            "post_mult": post_mult,
            "post_eps": post_eps,
            "sinkhorn_iters": sinkhorn_iters,
        }

    return build


def _comb(gen: torch.Generator, tokens: int, n: int) -> torch.Tensor:
    """A positive, column-normalized, non-symmetric mixing matrix per token, as hc_pre's Sinkhorn gives."""
    c = torch.softmax(randn(gen, (tokens, n, n), torch.float32, 1.5), dim=-1)
    return c / c.sum(dim=-2, keepdim=True)


def hc_post(tokens: int, n: int, d: int, *, comb: bool, magnitude: float = 1.0, strided: bool = False):
    """hc_post on a block output y [tokens, d] and streams [tokens, n, d]; ``comb``: DeepSeek-V4's mixing."""

    def build(gen: torch.Generator, dtype: torch.dtype):
        return {
            "y": randn(gen, (tokens, d), dtype, magnitude),
            "streams": _streams(gen, tokens, n, d, dtype, magnitude, strided),
            "post": 2 * torch.sigmoid(randn(gen, (tokens, n), torch.float32)),
            "comb": _comb(gen, tokens, n) if comb else None,
        }

    return build


def hc_head(tokens: int, n: int, d: int, *, norm_eps: float = 1e-6, hc_eps: float = 1e-6, magnitude: float = 1.0):
    """hc_head on streams [tokens, n, d]: fn [n, n*d], base [n], scale [1]."""

    def build(gen: torch.Generator, dtype: torch.dtype):
        return {
            "streams": _streams(gen, tokens, n, d, dtype, magnitude, False),
            **_mixing(gen, n, n, d, 1),
            "norm_eps": norm_eps,
            "hc_eps": hc_eps,
        }

    return build
