"""Reference MoE ops: routing, permutation by expert, and the expert MLP as their composition.

Plain PyTorch on whatever device the inputs live on. Routing computes in float32
(float64 when the logits or the bias are float64) and returns float32 weights and
int32 ids. Group-limited routing masks the dropped groups with -inf, as
DeepSeek's reference code and vLLM do (some Hugging Face routers use 0.0, which
differs once scores plus bias go negative).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

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
    expect,
)
from hetero.spec.types import FLOAT_DTYPES
from hetero_cpu_ref._int4 import check_zero_points, int4_grouped_linear
from hetero_cpu_ref._moe_quant import quant_expert_linear
from hetero_cpu_ref._util import acc_dtype, up
from hetero_cpu_ref.gemm import grouped_linear

__all__ = ["route", "moe_permute", "moe_unpermute", "fused_moe"]


def _limit_groups(select: torch.Tensor, n_group: int, topk_group: int, top2: bool) -> torch.Tensor:
    """Selection scores with every expert outside each token's topk_group best groups at -inf.

    A group's score is the sum of its two largest selection scores (top2,
    DeepSeek-V3) or its largest one (DeepSeek-V2).
    """
    rows, experts = select.shape
    grouped = select.reshape(rows, n_group, experts // n_group)
    group_score = grouped.topk(2, dim=-1).values.sum(dim=-1) if top2 else grouped.amax(dim=-1)
    best = group_score.topk(topk_group, dim=-1).indices
    keep = torch.zeros(rows, n_group, dtype=torch.bool, device=select.device).scatter_(1, best, True)
    keep = keep.repeat_interleave(experts // n_group, dim=1)
    return select.masked_fill(~keep, float("-inf"))


def route(
    router_logits: torch.Tensor,
    *,
    top_k: int,
    scoring: str = "softmax",
    renormalize: bool = True,
    n_group: int = 1,
    topk_group: int = 1,
    correction_bias: torch.Tensor | None = None,
    routed_scaling_factor: float = 1.0,
    fixed_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    op = "route"
    check_route(
        op,
        router_logits,
        top_k,
        scoring,
        renormalize,
        n_group,
        topk_group,
        correction_bias,
        routed_scaling_factor,
        fixed_ids,
    )

    acc = acc_dtype(router_logits, correction_bias)
    logits = up(router_logits, acc)
    if scoring == "softmax":
        scores = logits.softmax(dim=-1)
    elif scoring == "sigmoid":
        scores = logits.sigmoid()
    else:  # sqrtsoftplus (DeepSeek-V4)
        scores = F.softplus(logits).sqrt()
    if fixed_ids is not None:  # hash routing: the experts are given, only weighted
        check_fixed_ids(op, fixed_ids, logits.shape[1])
        ids = fixed_ids.long()
    else:
        select = scores if correction_bias is None else scores + up(correction_bias, acc)
        if n_group > 1:
            select = _limit_groups(select, n_group, topk_group, top2=correction_bias is not None)
        ids = select.topk(top_k, dim=-1, sorted=True).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    weights = weights * routed_scaling_factor
    return weights.float(), ids.to(torch.int32)


def moe_permute(
    x: torch.Tensor, ids: torch.Tensor, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    op = "moe_permute"
    check_tensor(op, "x", x, ndim=2)
    experts = check_int(op, "num_experts", num_experts, 1)
    check_tensor(op, "ids", ids)
    check_same_device(op, x=x, ids=ids)  # before reading its values
    k = check_ids(op, ids, x.shape[0], experts)
    expect(k >= 1, op, "ids", "at least one column (top_k >= 1)", f"shape {list(ids.shape)}")

    flat = ids.reshape(-1).long()  # pair (m, s) sits at m * k + s
    perm = torch.sort(flat, stable=True).indices
    counts = torch.bincount(flat, minlength=experts)
    group_ends = counts.cumsum(0).to(torch.int32)
    return x[perm // k], group_ends, perm


def moe_unpermute(y_sorted: torch.Tensor, perm: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    op = "moe_unpermute"
    check_tensor(op, "y_sorted", y_sorted, ndim=2, dtypes=FLOAT_DTYPES)
    check_weights(op, weights, None)
    rows, k = weights.shape
    check_tensor(op, "y_sorted", y_sorted, shape=(rows * k, None))
    check_tensor(op, "perm", perm)
    check_same_device(op, y_sorted=y_sorted, perm=perm, weights=weights)  # before reading its values
    check_perm(op, perm, rows * k)

    acc = acc_dtype(y_sorted, weights)
    pair_weight = up(weights, acc).reshape(-1)[perm]  # the weight of each sorted row
    out = torch.zeros(rows, y_sorted.shape[1], dtype=acc, device=y_sorted.device)
    out.index_add_(0, perm // k, up(y_sorted, acc) * pair_weight.unsqueeze(1))
    return out.to(y_sorted.dtype)


def _activation(gate_up: torch.Tensor, activation: str, alpha: float, limit: float | None) -> torch.Tensor:
    """act(gate, up) of the [gate | up] halves, in float32 or wider, rounded to gate_up's dtype."""
    a = up(gate_up, acc_dtype(gate_up))
    inter = a.shape[-1] // 2
    gate, upv = a[..., :inter], a[..., inter:]
    if activation != "silu":
        gate, upv = gate.clamp(max=limit), upv.clamp(min=-limit, max=limit)
    if activation == "swigluoai":
        h = (upv + 1) * gate * torch.sigmoid(alpha * gate)
    else:  # silu, swiglu_clamp
        h = F.silu(gate) * upv
    return h.to(gate_up.dtype)


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    *,
    activation: str = "silu",
    alpha: float = 1.702,
    limit: float | None = None,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    act_quant: str | None = None,
    act_scale_fmt: str = "float",
    w13_zero_point: torch.Tensor | None = None,
    w2_zero_point: torch.Tensor | None = None,
    group_size: int | None = None,
) -> torch.Tensor:
    op = "fused_moe"
    forms = check_fused_moe(
        op,
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
        int4=(w13_zero_point, w2_zero_point, group_size),
    )

    x_sorted, group_ends, perm = moe_permute(x, ids, w13.shape[0])
    if forms == ("int4", "int4"):  # spec 1.9: packed int4 experts (W4A16), weight-only
        check_zero_points(op, ("w13_zero_point", w13_zero_point), ("w2_zero_point", w2_zero_point))
        ends = group_ends.tolist()
        gate_up = int4_grouped_linear(x_sorted, w13, w13_scale, w13_zero_point, group_size, ends, w13_bias, x.dtype)
        hidden = _activation(gate_up, activation, float(alpha), None if limit is None else float(limit))
        y_sorted = int4_grouped_linear(hidden, w2, w2_scale, w2_zero_point, group_size, ends, w2_bias, x.dtype)
        return moe_unpermute(y_sorted, perm, weights)
    if forms is None:
        gate_up = grouped_linear(x_sorted, w13, group_ends.tolist(), w13_bias, x.dtype)  # [M*k, 2I] in x's dtype
    else:
        gate_up = quant_expert_linear(
            x_sorted, w13, w13_scale, forms[0], w13_bias, group_ends, act_quant, act_scale_fmt
        )
    hidden = _activation(gate_up, activation, float(alpha), None if limit is None else float(limit))  # [M*k, I]
    if forms is None:
        y_sorted = grouped_linear(hidden, w2, group_ends.tolist(), w2_bias, x.dtype)  # [M*k, H]
    else:
        y_sorted = quant_expert_linear(hidden, w2, w2_scale, forms[1], w2_bias, group_ends, act_quant, act_scale_fmt)
    return moe_unpermute(y_sorted, perm, weights)
