"""MoE ops from torch's batched operators: route, moe_permute (a stable argsort of the expert ids),
moe_unpermute and fused_moe (permute, two grouped GEMMs around the activation, unpermute; on a
CPU in float32, hetero-torch's native expert GEMM instead: ``_moe_native``).

Semantics: ``hetero.spec.moe``. Routing computes in float32 (float64 for float64 logits or bias);
group-limited routing masks the dropped groups with -inf. Expert ids and perm are range-checked on
the host before anything indexes with them.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from hetero.errors import OpError
from hetero.spec.checks import (
    check_fixed_ids,
    check_fused_moe,
    check_ids,
    check_int,
    check_perm,
    check_route,
    check_same_device,
    check_tensor,
    check_weights,
)
from hetero.spec.types import FLOAT_DTYPES
from hetero_torch import _layers_native as native_layers
from hetero_torch._gemm_grouped import grouped_matmul
from hetero_torch._int4 import int4_fused_moe
from hetero_torch._layers_util import acc_dtype
from hetero_torch._moe_native import native_fused_moe
from hetero_torch._opaque import opaque

__all__ = ["route", "moe_permute", "moe_unpermute", "fused_moe"]


def _limit_groups(select: torch.Tensor, n_group: int, topk_group: int, top2: bool) -> torch.Tensor:
    """Selection scores with every expert outside each token's topk_group best groups at -inf; a group
    scores the sum of its two largest selection scores (top2, DeepSeek-V3) or its largest (V2)."""
    rows, experts = select.shape
    grouped = select.reshape(rows, n_group, experts // n_group)
    group_score = grouped.topk(2, dim=-1).values.sum(dim=-1) if top2 else grouped.amax(dim=-1)
    best = group_score.topk(topk_group, dim=-1).indices
    keep = torch.zeros(rows, n_group, dtype=torch.bool, device=select.device).scatter_(1, best, True)
    return grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).reshape(rows, experts)


#: route's scoring functions, on float32 (or float64) logits
_SCORES = {
    "softmax": lambda x: x.softmax(dim=-1),
    "sigmoid": torch.sigmoid,
    "sqrtsoftplus": lambda x: F.softplus(x).sqrt(),  # DeepSeek-V4
}


def route(
    router_logits,
    *,
    top_k,
    scoring="softmax",
    renormalize=True,
    n_group=1,
    topk_group=1,
    correction_bias=None,
    routed_scaling_factor=1.0,
    fixed_ids=None,
):
    args = (top_k, scoring, renormalize, n_group, topk_group, correction_bias, routed_scaling_factor, fixed_ids)
    check_route("route", router_logits, *args)
    acc = acc_dtype(router_logits, correction_bias)
    logits = router_logits.to(acc)
    scores = _SCORES[scoring](logits)
    if fixed_ids is not None:  # hash routing: range-checked on the host before the gather indexes with them
        check_fixed_ids("route", fixed_ids, logits.shape[1])
        ids = fixed_ids.long()
    else:
        select = scores if correction_bias is None else scores + correction_bias.to(acc)
        if n_group > 1:
            select = _limit_groups(select, n_group, topk_group, top2=correction_bias is not None)
        ids = select.topk(top_k, dim=-1, sorted=True).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return (weights * routed_scaling_factor).float(), ids.to(torch.int32)


def _sort_pairs(ids: torch.Tensor, experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(perm int64 [M*k]: the flat pair indices stably sorted by expert, group_ends int32 [experts])."""
    flat = ids.reshape(-1).long()
    perm = torch.sort(flat, stable=True).indices
    group_ends = torch.bincount(flat, minlength=experts).cumsum(0).to(torch.int32)
    return perm, group_ends


def moe_permute(x, ids, num_experts):
    op = "moe_permute"
    check_tensor(op, "x", x, ndim=2)
    experts = check_int(op, "num_experts", num_experts, 1)
    check_tensor(op, "ids", ids)
    check_same_device(op, x=x, ids=ids)
    k = check_ids(op, ids, x.shape[0], experts)
    if not (k >= 1):
        raise OpError(op, "ids", "at least one column (top_k >= 1)", f"shape {list(ids.shape)}")
    perm, group_ends = _sort_pairs(ids, experts)
    return x.index_select(0, perm // k), group_ends, perm


def _unpermute(y_sorted: torch.Tensor, perm: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum_s weights[m, s] * y_sorted[r] over the rows r with perm[r] = m*k + s, in float32 or wider."""
    rows, k = weights.shape
    acc = acc_dtype(y_sorted, weights)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel(), device=perm.device)  # the sorted row of each flat pair
    pairs = y_sorted.index_select(0, inverse).reshape(rows, k, y_sorted.shape[1]).to(acc)
    return torch.einsum("mk,mkh->mh", weights.to(acc), pairs).to(y_sorted.dtype)


def moe_unpermute(y_sorted, perm, weights):
    op = "moe_unpermute"
    check_tensor(op, "y_sorted", y_sorted, ndim=2, dtypes=FLOAT_DTYPES)
    check_weights(op, weights, None)
    rows, k = weights.shape
    check_tensor(op, "y_sorted", y_sorted, shape=(rows * k, None))
    check_tensor(op, "perm", perm)
    check_same_device(op, y_sorted=y_sorted, perm=perm, weights=weights)
    check_perm(op, perm, rows * k)
    return _unpermute(y_sorted, perm, weights)


def _activation(gate_up: torch.Tensor, activation: str, alpha: float, limit: float | None) -> torch.Tensor:
    """act(gate, up) of the [gate | up] halves in float32 or wider, rounded to gate_up's dtype."""
    if activation == "silu" and native_layers.act_applies(gate_up):
        # one pass, widened per element: a bf16 prefill's pairs widened whole cost 4x the activation
        return native_layers.silu_and_mul(gate_up)
    gate, up = gate_up.to(acc_dtype(gate_up)).chunk(2, dim=-1)
    if activation != "silu":
        gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
    if activation == "swigluoai":
        h = (up + 1) * gate * torch.sigmoid(alpha * gate)
    else:  # silu, swiglu_clamp
        h = F.silu(gate) * up
    return h.to(gate_up.dtype)


def _expert_linear(
    a: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    expert: torch.Tensor,
    group_ends: torch.Tensor,
    ends: list[int],
) -> torch.Tensor:
    """Row r of ``a @ w[expert[r]].T + bias[expert[r]]`` (bias added in float32), rounded once to a's dtype.
    w is an expert weight (fused_moe's contract): packed on first sight, not at a later, timed call."""
    if bias is None:
        return grouped_matmul(a, w, group_ends, ends, a.dtype, weights=True)
    acc = acc_dtype(a, w)
    y = grouped_matmul(a, w, group_ends, ends, acc, weights=True)
    return (y + bias.to(acc).index_select(0, expert)).to(a.dtype)


def _experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    activation: str,
    alpha: float,
    limit: float | None,
    w13_bias: torch.Tensor | None,
    w2_bias: torch.Tensor | None,
    w13_scale: torch.Tensor | None,
    w2_scale: torch.Tensor | None,
    act_quant: str | None,
    act_scale_fmt: str,
    form13: str | None,
    form2: str | None,
) -> torch.Tensor:
    """fused_moe of inputs validated but for the ids' values, which are range-checked here (by the
    native kernel, or on the host) before anything indexes with them; ``form13`` / ``form2`` the
    weight scales' forms (None: float weights)."""
    if form13 is None:
        out = native_fused_moe(x, w13, w2, weights, ids, activation, alpha, limit, w13_bias, w2_bias)
        if out is not None:
            return out
    check_ids("fused_moe", ids, x.shape[0], w13.shape[0])
    act = functools.partial(_activation, activation=activation, alpha=alpha, limit=limit)
    k = ids.shape[1]
    perm, group_ends = _sort_pairs(ids, w13.shape[0])
    ends = group_ends.tolist()
    x_sorted = x.index_select(0, perm // k)
    expert = ids.reshape(-1).long().index_select(0, perm)
    if form13 is None:
        gate_up = _expert_linear(x_sorted, w13, w13_bias, expert, group_ends, ends)
        y_sorted = _expert_linear(act(gate_up), w2, w2_bias, expert, group_ends, ends)
    else:
        from hetero_torch._moe_quant import quant_expert_linear

        gate_up = quant_expert_linear(
            x_sorted, w13, w13_scale, form13, w13_bias, expert, group_ends, ends, act_quant, act_scale_fmt
        )
        y_sorted = quant_expert_linear(
            act(gate_up), w2, w2_scale, form2, w2_bias, expert, group_ends, ends, act_quant, act_scale_fmt
        )
    return _unpermute(y_sorted, perm, weights)


# torch.compile sees the experts as one opaque op, so a compiled forward stays one graph: the ids
# and the expert groups' ends are read on the host (and CPU grouped_mm's fake kernel declines
# float32, which the real one takes). Eager calls skip the custom op's dispatch.
_experts_op = opaque("fused_moe", _experts, lambda x, *args: torch.empty_like(x))


def fused_moe(
    x,
    w13,
    w2,
    weights,
    ids,
    *,
    activation="silu",
    alpha=1.702,
    limit=None,
    w13_bias=None,
    w2_bias=None,
    w13_scale=None,
    w2_scale=None,
    act_quant=None,
    act_scale_fmt="float",
    w13_zero_point=None,
    w2_zero_point=None,
    group_size=None,
):
    traced = torch.compiler.is_compiling()
    forms = check_fused_moe(
        "fused_moe",
        x,
        w13,
        w2,
        weights,
        ids,
        activation,
        alpha,
        limit,
        w13_bias,
        w2_bias,
        (w13_scale, w2_scale, act_quant, act_scale_fmt),
        read_ids=False,
        int4=(w13_zero_point, w2_zero_point, group_size),
    )
    if forms == ("int4", "int4"):  # spec 1.9: packed int4 experts (W4A16)
        lim = None if limit is None else float(limit)
        args = (x, w13, w2, weights, ids, activation, float(alpha), lim, w13_bias, w2_bias, w13_scale, w2_scale)
        return int4_fused_moe(*args, w13_zero_point, w2_zero_point, int(group_size))
    run = _experts_op if traced else _experts
    return run(
        x,
        w13,
        w2,
        weights,
        ids,
        activation,
        float(alpha),
        None if limit is None else float(limit),
        w13_bias,
        w2_bias,
        w13_scale,
        w2_scale,
        act_quant,
        act_scale_fmt,
        *(forms or (None, None)),
    )
