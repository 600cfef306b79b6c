"""The checks of the layer ops rotary_embedding and rms_norm, with the rotary positions check, for
``hetero.spec.checks`` (import them from there): each failure is an OpError naming the op, the
argument, what was expected and what came.
"""

from __future__ import annotations

import math
import numbers

import torch

from hetero.errors import OpError
from hetero.spec._checks_core import check_at_least_1d, check_same_device, check_tensor
from hetero.spec.types import FLOAT_DTYPES

__all__ = ["check_positions", "check_rms_norm", "check_rotary"]


def check_rotary(
    op: str,
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: object,
    *,
    read_positions: bool = True,
) -> tuple[int, int, int, int]:
    """The arguments of rotary_embedding; returns (tokens, head_dim, max_pos, rot).

    ``read_positions=False`` skips the range check of ``positions``, which reads them on the host.
    """
    check_tensor(op, "q", q, ndim=3, dtypes=FLOAT_DTYPES)
    tokens, _, head_dim = q.shape
    check_tensor(op, "k", k, ndim=3, dtypes=FLOAT_DTYPES)
    if not (k.shape[0] == tokens):
        raise OpError(op, "k", f"{tokens} tokens (that of 'q')", f"shape {list(k.shape)}")
    if not (k.shape[2] == head_dim):
        raise OpError(op, "k", f"head dim {head_dim} (that of 'q')", f"shape {list(k.shape)}")
    check_tensor(op, "positions", positions, shape=(tokens,), dtypes=(torch.int64,))
    check_tensor(op, "cos_sin_cache", cos_sin_cache, ndim=2, dtypes=FLOAT_DTYPES)
    max_pos, rot = cos_sin_cache.shape
    if not (rot > 0 and rot % 2 == 0 and rot <= head_dim):
        raise OpError(
            op,
            "cos_sin_cache",
            f"a positive even number of columns (rot) <= the head dim {head_dim}",
            f"shape {list(cos_sin_cache.shape)}",
        )
    if not isinstance(is_neox, bool):
        raise OpError(op, "is_neox", "a bool", type(is_neox).__name__)
    check_same_device(op, q=q, k=k, positions=positions, cos_sin_cache=cos_sin_cache)
    if read_positions:
        check_positions(op, positions, max_pos)
    return tokens, head_dim, max_pos, rot


def check_positions(op: str, positions: torch.Tensor, max_pos: int) -> None:
    """Rotary positions in [0, max_pos), the rows of the cos/sin cache (reads them on the host)."""
    if positions.numel():
        lo, hi = int(positions.min()), int(positions.max())
        if not (lo >= 0 and hi < max_pos):
            raise OpError(
                op, "positions", f"positions in [0, {max_pos}) (rows of 'cos_sin_cache')", f"values in [{lo}, {hi}]"
            )


def check_rms_norm(op: str, x: object, weight: object, eps: object, residual: object) -> int:
    """The arguments of rms_norm; returns the hidden size."""
    x = check_at_least_1d(op, "x", x, FLOAT_DTYPES)
    hidden = x.shape[-1]
    check_tensor(op, "weight", weight, shape=(hidden,), dtypes=FLOAT_DTYPES)
    ok_eps = isinstance(eps, numbers.Real) and not isinstance(eps, bool) and math.isfinite(eps) and eps > 0
    if not ok_eps:
        raise OpError(op, "eps", "a positive finite number", repr(eps))
    if residual is not None:
        check_tensor(op, "residual", residual, dtypes=(x.dtype,))
        assert isinstance(residual, torch.Tensor)
        if not (residual.shape == x.shape):
            raise OpError(op, "residual", f"shape {list(x.shape)} (that of 'x')", f"shape {list(residual.shape)}")
    check_same_device(op, x=x, weight=weight, residual=residual)
    return hidden
