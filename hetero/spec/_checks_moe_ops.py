"""Argument validation of the MoE ops (route, moe_permute, moe_unpermute, fused_moe), shared by the
backends that check in Python.

Every failure is a hetero.OpError naming the op, the argument, what was expected
and what came.
"""

from __future__ import annotations

import math
import numbers

import torch

from hetero.errors import OpError
from hetero.spec._checks_core import INDEX_DTYPES, check_ids, check_same_device, check_tensor
from hetero.spec._checks_int4 import PACKED_INT4, check_fused_moe_int4, check_no_int4
from hetero.spec._checks_moe import check_fused_moe_options, check_fused_moe_weights
from hetero.spec._checks_quant import check_fused_moe_quant
from hetero.spec.moe import SCORING
from hetero.spec.types import FLOAT_DTYPES

__all__ = ["WEIGHT_DTYPES", "check_int", "check_route", "check_fixed_ids", "check_weights", "check_fused_moe"]

#: Routing weights: float32 (float64 in the oracle's float64 run).
WEIGHT_DTYPES = (torch.float32, torch.float64)


def check_int(op: str, arg: str, value: object, lo: int, hi: int | None = None, why: str = "") -> int:
    """An integer (not a bool) in [lo, hi] (hi None = unbounded)."""
    is_int = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    rng = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"
    if not is_int:
        raise OpError(op, arg, rng + why, repr(value))
    if not (int(value) >= lo and (hi is None or int(value) <= hi)):
        raise OpError(op, arg, rng + why, repr(value))
    return int(value)


def check_route(
    op: str,
    logits: object,
    top_k: object,
    scoring: object,
    renormalize: object,
    n_group: object,
    topk_group: object,
    bias: object,
    factor: object,
    fixed_ids: object = None,
) -> None:
    """Validate every argument of route but the values of fixed_ids (``check_fixed_ids`` reads those)."""
    check_tensor(op, "router_logits", logits, ndim=2, dtypes=FLOAT_DTYPES)
    assert isinstance(logits, torch.Tensor)
    experts = logits.shape[1]
    if scoring not in SCORING:
        raise OpError(op, "scoring", "one of " + ", ".join(repr(s) for s in SCORING), repr(scoring))
    if not isinstance(renormalize, bool):
        raise OpError(op, "renormalize", "a bool", repr(renormalize))
    ok_factor = isinstance(factor, numbers.Real) and not isinstance(factor, bool) and math.isfinite(factor)
    if not ok_factor:
        raise OpError(op, "routed_scaling_factor", "a finite number", repr(factor))
    groups = check_int(op, "n_group", n_group, 1)
    if not (experts % groups == 0):
        raise OpError(op, "n_group", f"a divisor of the expert count E = {experts}", str(groups))
    k = check_int(op, "top_k", top_k, 1, experts, f" (E = {experts} experts)")
    kept = check_int(op, "topk_group", topk_group, 1, groups, f" (n_group = {groups})")
    per_group = experts // groups
    if not (kept * per_group >= k):
        raise OpError(
            op, "topk_group", f"topk_group * E/n_group >= top_k = {k} (groups of {per_group} experts)", str(kept)
        )
    if fixed_ids is not None:  # spec 1.8: hash routing, the experts given
        check_tensor(op, "fixed_ids", fixed_ids, shape=(logits.shape[0], k), dtypes=INDEX_DTYPES)
        check_same_device(op, router_logits=logits, fixed_ids=fixed_ids)
        if bias is not None:
            raise OpError(op, "correction_bias", "None with fixed_ids (the experts are given, not chosen)", "a tensor")
        if groups != 1:
            raise OpError(op, "n_group", "1 with fixed_ids (the experts are given, not chosen)", str(groups))
    if bias is None:
        return
    check_tensor(op, "correction_bias", bias, shape=(experts,), dtypes=FLOAT_DTYPES)
    check_same_device(op, router_logits=logits, correction_bias=bias)
    if not (groups == 1 or per_group >= 2):
        raise OpError(
            op,
            "n_group",
            f"groups of at least 2 experts with correction_bias (the group score sums the top 2; E = {experts})",
            str(groups),
        )


def check_fixed_ids(op: str, fixed_ids: torch.Tensor, experts: int) -> None:
    """route's fixed_ids (shape and dtype checked by ``check_route``): every id in [0, E), read on the host."""
    if fixed_ids.numel():
        lo, hi = int(fixed_ids.min()), int(fixed_ids.max())
        if not (lo >= 0 and hi < experts):
            raise OpError(op, "fixed_ids", f"expert ids in [0, {experts})", f"values in [{lo}, {hi}]")


def check_weights(op: str, weights: object, ids_shape: tuple[int, ...] | None) -> None:
    """Routing weights float32 (float64 for the oracle) [M, k], k >= 1, of the shape of ids when given."""
    check_tensor(op, "weights", weights, ndim=2, dtypes=WEIGHT_DTYPES)
    assert isinstance(weights, torch.Tensor)
    if ids_shape is not None:
        if not (tuple(weights.shape) == ids_shape):
            raise OpError(op, "weights", f"shape {list(ids_shape)} (that of 'ids')", f"shape {list(weights.shape)}")
    if not (weights.shape[1] >= 1):
        raise OpError(op, "weights", "at least one column (top_k >= 1)", f"shape {list(weights.shape)}")


def check_fused_moe(
    op: str,
    x: object,
    w13: object,
    w2: object,
    weights: object,
    ids: object,
    activation: object,
    alpha: object = 1.702,
    limit: object = None,
    w13_bias: object = None,
    w2_bias: object = None,
    quant: tuple[object, object, object, object] = (None, None, None, "float"),
    *,
    read_ids: bool = True,
    int4: tuple[object, object, object] = (None, None, None),
) -> tuple[str, str] | None:
    """Validate every argument of fused_moe; ``quant`` is (w13_scale, w2_scale, act_quant, act_scale_fmt),
    ``int4`` (w13_zero_point, w2_zero_point, group_size) (spec 1.9). Returns the weight scales' forms
    (("int4", "int4") for packed int4 experts), or None for float weights. ``read_ids=False`` leaves the
    ids' range check (a host read) to the caller."""
    check_fused_moe_options(op, activation, alpha, limit)
    if isinstance(w13, torch.Tensor) and w13.dtype == PACKED_INT4:  # spec 1.9: W4A16 experts
        rows, _, experts = check_fused_moe_int4(op, x, w13, w2, (w13_bias, w2_bias), quant, int4[:2], int4[2])
        forms: tuple[str, str] | None = ("int4", "int4")
    else:
        if isinstance(w13, torch.Tensor):
            check_no_int4(op, "w13", w13.dtype, w13_zero_point=int4[0], w2_zero_point=int4[1], group_size=int4[2])
        rows, _, experts = check_fused_moe_weights(op, x, w13, w2, w13_bias, w2_bias)
        forms = check_fused_moe_quant(op, w13, w2, *quant, scale_dtypes=WEIGHT_DTYPES)
    assert isinstance(w13, torch.Tensor) and isinstance(w2, torch.Tensor)
    w13_scale, w2_scale = quant[0], quant[1]
    check_tensor(op, "ids", ids)
    check_tensor(op, "weights", weights)
    check_same_device(
        op,
        x=x,
        w13=w13,
        w2=w2,
        w13_bias=w13_bias,
        w2_bias=w2_bias,
        w13_scale=w13_scale,
        w2_scale=w2_scale,
        w13_zero_point=int4[0],
        w2_zero_point=int4[1],
        weights=weights,
        ids=ids,
    )  # before reading values
    check_ids(op, ids, rows, experts, read_values=read_ids)
    assert isinstance(ids, torch.Tensor)
    check_weights(op, weights, tuple(ids.shape))
    return forms
