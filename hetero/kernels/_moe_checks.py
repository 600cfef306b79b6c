"""Argument checks of the Triton MoE ops (private: the ops live in hetero.kernels.moe).

Only cheap checks (ranks, dtypes, shapes, devices, options): nothing reads a tensor's values on
the host, so expert ids and perm are not range-checked (the kernels mask them instead).
"""

from __future__ import annotations

import numbers

import torch

from hetero.spec._checks_moe import check_fused_moe_options, check_fused_moe_weights
from hetero.spec.checks import check_same_device, check_tensor, expect

__all__ = ["check_int", "check_ids", "check_weights", "check_fused"]

_INDEX = (torch.int32, torch.int64)
_WEIGHT_DTYPES = (torch.float32, torch.float64)


def check_int(op: str, arg: str, value: object, lo: int, hi: int | None = None) -> int:
    """An integer (not a bool) in [lo, hi] (hi None: unbounded)."""
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    rng = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"
    expect(ok and int(value) >= lo and (hi is None or int(value) <= hi), op, arg, rng, repr(value))
    return int(value)


def check_ids(op: str, ids: object, rows: int) -> int:
    """Expert ids int32/int64 [rows, k], k >= 1 (their values are the kernels' to mask); returns k."""
    check_tensor(op, "ids", ids, ndim=2, dtypes=_INDEX)
    expect(ids.shape[0] == rows, op, "ids", f"{rows} rows (one per token)", ids.shape[0])
    expect(ids.shape[1] >= 1, op, "ids", "at least one column (top_k >= 1)", f"shape {list(ids.shape)}")
    return ids.shape[1]


def check_weights(op: str, weights: object, shape: tuple[int, ...] | None) -> None:
    """Routing weights float32/float64 [M, k], k >= 1, of ``shape`` when given."""
    check_tensor(op, "weights", weights, ndim=2, dtypes=_WEIGHT_DTYPES)
    if shape is not None:
        expect(
            tuple(weights.shape) == shape,
            op,
            "weights",
            f"shape {list(shape)} (that of 'ids')",
            f"shape {list(weights.shape)}",
        )
    expect(weights.shape[1] >= 1, op, "weights", "at least one column (top_k >= 1)", f"shape {list(weights.shape)}")


def check_fused(op, x, w13, w2, weights, ids, activation, alpha, limit, w13_bias, w2_bias) -> int:
    """The cheap checks of fused_moe (no tensor value is read); returns top_k."""
    check_fused_moe_options(op, activation, alpha, limit)
    rows, _, _ = check_fused_moe_weights(op, x, w13, w2, w13_bias, w2_bias)
    k = check_ids(op, ids, rows)
    check_weights(op, weights, tuple(ids.shape))
    check_same_device(op, x=x, w13=w13, w2=w2, w13_bias=w13_bias, w2_bias=w2_bias, weights=weights, ids=ids)
    return k
