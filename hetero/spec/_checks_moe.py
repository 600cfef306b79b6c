"""The cheap checks of ``fused_moe`` shared by every backend: options, ranks, shapes, dtypes
(no tensor value is read)."""

from __future__ import annotations

import math
import numbers

import torch

from hetero.errors import OpError
from hetero.spec._checks_core import check_tensor
from hetero.spec.moe import ACTIVATIONS
from hetero.spec.types import FLOAT_DTYPES

__all__ = ["check_fused_moe_options", "check_fused_moe_weights"]

QUANT_WEIGHT_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.int8)


def _real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def check_fused_moe_options(op: str, activation: object, alpha: object, limit: object) -> None:
    """activation one of ACTIVATIONS; alpha finite; limit None for silu, finite and > 0 otherwise."""
    if activation not in ACTIVATIONS:
        raise OpError(op, "activation", "one of " + ", ".join(repr(a) for a in ACTIVATIONS), repr(activation))
    if not _real(alpha):
        raise OpError(op, "alpha", "a finite number", repr(alpha))
    if activation == "silu":
        if limit is not None:
            raise OpError(
                op, "limit", "None with activation 'silu' (only the clamped activations take a limit)", repr(limit)
            )
    else:
        if not (_real(limit) and limit > 0):
            raise OpError(op, "limit", f"a finite number > 0 with activation {activation!r}", repr(limit))


def check_fused_moe_weights(
    op: str, x: object, w13: object, w2: object, w13_bias: object, w2_bias: object
) -> tuple[int, int, int]:
    """x [M, H]; w13 [E, 2I, H] and w2 [E, H, I] of x's dtype, or both of one quantized dtype
    (spec 1.4: their scales are ``_checks_quant.check_fused_moe_quant``'s); the optional biases
    [E, 2I], [E, H] of x's dtype; returns (M, H, E)."""
    check_tensor(op, "x", x, ndim=2, dtypes=FLOAT_DTYPES)
    assert isinstance(x, torch.Tensor)
    rows, hidden = x.shape
    check_tensor(op, "w13", w13, ndim=3, dtypes=(x.dtype, *QUANT_WEIGHT_DTYPES))
    assert isinstance(w13, torch.Tensor)
    experts, two_i, _ = w13.shape
    if not (two_i % 2 == 0 and w13.shape[2] == hidden):
        raise OpError(
            op, "w13", f"shape [E, 2I, H] with an even 2I and H = {hidden} (x's columns)", f"shape {list(w13.shape)}"
        )
    check_tensor(op, "w2", w2, shape=(experts, hidden, two_i // 2), dtypes=(w13.dtype,))
    if w13_bias is not None:
        check_tensor(op, "w13_bias", w13_bias, shape=(experts, two_i), dtypes=(x.dtype,))
    if w2_bias is not None:
        check_tensor(op, "w2_bias", w2_bias, shape=(experts, hidden), dtypes=(x.dtype,))
    return rows, hidden, experts
