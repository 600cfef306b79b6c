"""Triton MoE ops: route (torch), moe_permute, moe_unpermute and fused_moe.

Semantics: ``hetero.spec.moe``. Kernels: ``hetero.kernels._moe_kernels`` (the stable counting
sort and the weighted combine) and ``hetero.kernels._gemm_kernels`` (the grouped
GEMM). Checks: ``hetero.kernels._moe_checks``.

fused_moe is six launches (plus one memset), none of which synchronizes with the host:

1. the stable counting sort of the (token, slot) pairs by expert (count, offsets, place)
   -> group_ends, perm and its inverse inv;
2. grouped GEMM 1 over the sorted pairs, reading x's rows through perm (x_sorted is never
   materialized), gate and up tiles of one column block computed together; the epilogue adds
   the expert's w13_bias, rounds gate and up to x's dtype, applies the activation (silu,
   swigluoai, swiglu_clamp) and stores h in x's dtype;
3. grouped GEMM 2 (w2), its epilogue adding the expert's w2_bias -> y_sorted in x's dtype;
4. the combine: y[m] = sum_s weights[m, s] * y_sorted[inv[m * k + s]] in float32.

Quantized experts (fp8 / int8 weights) replace steps 2-3 by ``hetero.kernels._moe_quant``: the
scaled grouped GEMM kernel with the same gather and epilogues, inputs quantized per token (group)
by the quantizer kernel, or float inputs with weight tiles dequantized in the kernel (W8A16).
Packed int4 experts (W4A16) replace them by ``hetero.kernels.int4``'s int4 grouped GEMMs.

The roundings are those of the reference
composition (permute, grouped_gemm, activation, grouped_gemm, unpermute; each bias added in
float32 before its rounding). Only cheap checks run (ranks, dtypes, shapes, devices): expert ids
and perm are not range-checked, since that would read them on the host (route's spec 1.8 ``fixed_ids``
are clamped into [0, E) for its gather: a bad id gives an undefined weight, never a read outside).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hetero.kernels import _moe_kernels as kern
from hetero.kernels import int4
from hetero.kernels._moe_checks import check_fused, check_ids, check_int, check_weights
from hetero.kernels._moe_quant import quant_experts
from hetero.kernels._triton import triton_modules
from hetero.kernels.gemm import interpreted, launch_grouped
from hetero.kernels.tuning import Tuning
from hetero.spec._checks_quant import check_fused_moe_quant
from hetero.spec.checks import check_route, check_same_device, check_tensor
from hetero.spec.moe import ACTIVATIONS
from hetero.spec.types import FLOAT_DTYPES

triton, tl = triton_modules()

__all__ = ["route", "moe_permute", "moe_unpermute", "fused_moe"]

#: launch parameters of the data-movement kernels when the tuning table has no entry for them
_DEFAULTS = {
    "moe_permute": {"BLOCK_P": 128, "BLOCK_E": 64, "BLOCK_B": 16, "BLOCK_R": 16, "BLOCK_H": 256, "num_warps": 4},
    "moe_unpermute": {"BLOCK_T": 16, "BLOCK_H": 256, "num_warps": 4},
}
_INTERPRETED = {  # the interpreter pays per program and per op, not per element
    "moe_permute": {"BLOCK_P": 512, "BLOCK_E": 512, "BLOCK_B": 64, "BLOCK_R": 64, "BLOCK_H": 4096},
    "moe_unpermute": {"BLOCK_T": 64, "BLOCK_H": 4096},
}


def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def _params(tuning: Tuning, kernel: str) -> tuple[dict, dict]:
    params = dict(_DEFAULTS[kernel])
    if tuning.interpreted:
        params.update(_INTERPRETED[kernel])
    params.update(tuning(kernel))
    return Tuning.launch_options(params)


# ----------------------------------------------------------------------------- route (torch)


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
    experts = router_logits.shape[1]
    wide = torch.float64 in (router_logits.dtype, getattr(correction_bias, "dtype", None))
    logits = router_logits.to(torch.float64 if wide else torch.float32)
    if scoring == "softmax":
        scores = torch.softmax(logits, dim=-1)
    elif scoring == "sigmoid":
        scores = torch.sigmoid(logits)
    else:  # sqrtsoftplus (DeepSeek-V4)
        scores = F.softplus(logits).sqrt()
    if fixed_ids is not None:
        # hash routing: the ids are not read on the host; clamped, no gather can leave the scores
        weights = scores.gather(1, fixed_ids.long().clamp(0, experts - 1))
        ids = fixed_ids
    else:
        select = scores if correction_bias is None else scores + correction_bias.to(logits.dtype)
        if n_group > 1:
            rows, per_group = select.shape[0], experts // n_group
            by_group = select.view(rows, n_group, per_group)
            if correction_bias is not None:  # DeepSeek-V3: sum of the two best of each group
                group_score = by_group.topk(2, dim=-1).values.sum(dim=-1)
            else:  # DeepSeek-V2: the best of each group
                group_score = by_group.amax(dim=-1)
            best = group_score.topk(topk_group, dim=-1).indices
            keep = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, best, True)
            select = select.masked_fill(~keep.repeat_interleave(per_group, dim=1), float("-inf"))
        ids = select.topk(top_k, dim=-1, sorted=True).indices
        weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return (weights * routed_scaling_factor).float(), ids.to(torch.int32)


# ----------------------------------------------------------------------------- the stable sort


def _sort_pairs(flat_ids: torch.Tensor, experts: int, tuning: Tuning, *, want_inv: bool):
    """(perm int64 [P], group_ends int32 [E], inv int32 [P] or None) of the expert ids of the P pairs."""
    device, pairs = flat_ids.device, flat_ids.numel()
    meta, launch = _params(tuning, "moe_permute")
    e_pow2 = _pow2(experts)
    # the one-hot tile is [BLOCK_P, E_POW2]: keep it near 16K elements on hardware
    cap = meta["BLOCK_P"] if tuning.interpreted else max(16, 16384 // e_pow2)
    block_p = max(16, min(int(meta["BLOCK_P"]), cap, _pow2(pairs)))
    block_e = min(int(meta["BLOCK_E"]), e_pow2)
    nb = triton.cdiv(pairs, block_p)
    counts = torch.empty(nb, experts, dtype=torch.int32, device=device)
    offsets = torch.empty(nb, experts, dtype=torch.int32, device=device)
    totals = torch.zeros(experts, dtype=torch.int32, device=device)
    ends = torch.empty(experts, dtype=torch.int32, device=device)
    perm = torch.empty(pairs, dtype=torch.int64, device=device)
    inv = torch.empty(pairs, dtype=torch.int32, device=device) if want_inv else None
    kern._count_kernel[(nb,)](flat_ids, counts, totals, pairs, experts, E_POW2=e_pow2, BLOCK_P=block_p, **launch)
    kern._offsets_kernel[(triton.cdiv(experts, block_e),)](
        counts, totals, offsets, ends, nb, experts,
        E_POW2=e_pow2, BLOCK_E=block_e, BLOCK_B=int(meta["BLOCK_B"]), **launch)  # fmt: skip
    kern._place_kernel[(nb,)](flat_ids, offsets, perm, inv if want_inv else perm, pairs, experts,
                              WRITE_INV=want_inv, E_POW2=e_pow2, BLOCK_P=block_p, **launch)  # fmt: skip
    return perm, ends, inv


def _combine(y_sorted: torch.Tensor, inv: torch.Tensor, weights: torch.Tensor, tuning: Tuning) -> torch.Tensor:
    rows, k = weights.shape
    hidden = y_sorted.shape[1]
    out = torch.empty(rows, hidden, dtype=y_sorted.dtype, device=y_sorted.device)
    if rows == 0 or hidden == 0:
        return out
    meta, launch = _params(tuning, "moe_unpermute")
    bt, bh = max(1, min(int(meta["BLOCK_T"]), _pow2(rows))), min(int(meta["BLOCK_H"]), _pow2(hidden))
    wide = torch.float64 in (y_sorted.dtype, weights.dtype)
    kern._combine_kernel[(triton.cdiv(rows, bt), triton.cdiv(hidden, bh))](
        y_sorted, inv, weights, out, rows, hidden, k,
        y_sorted.stride(0), y_sorted.stride(1), weights.stride(0), weights.stride(1), out.stride(0), out.stride(1),
        ACC=tl.float64 if wide else tl.float32, SOFT_RTNE=interpreted(tuning),
        BLOCK_T=bt, BLOCK_H=bh, **launch)  # fmt: skip
    return out


# ----------------------------------------------------------------------------- ops


def moe_permute(x, ids, num_experts, *, tuning: Tuning):
    op = "moe_permute"
    check_tensor(op, "x", x, ndim=2)
    experts = check_int(op, "num_experts", num_experts, 1)
    rows, hidden = x.shape
    k = check_ids(op, ids, rows)
    check_same_device(op, x=x, ids=ids)
    pairs = rows * k
    if pairs == 0:
        return (
            x.new_empty(0, hidden),
            torch.zeros(experts, dtype=torch.int32, device=x.device),
            torch.empty(0, dtype=torch.int64, device=x.device),
        )
    perm, ends, _ = _sort_pairs(ids.reshape(-1).contiguous(), experts, tuning, want_inv=False)
    x_sorted = x.new_empty(pairs, hidden)
    if hidden:
        meta, launch = _params(tuning, "moe_permute")
        br, bh = min(int(meta["BLOCK_R"]), _pow2(pairs)), min(int(meta["BLOCK_H"]), _pow2(hidden))
        kern._gather_rows_kernel[(triton.cdiv(pairs, br), triton.cdiv(hidden, bh))](
            x, perm, x_sorted, pairs, hidden, k, x.stride(0), x.stride(1), x_sorted.stride(0), x_sorted.stride(1),
            BLOCK_R=br, BLOCK_H=bh, **launch)  # fmt: skip
    return x_sorted, ends, perm


def moe_unpermute(y_sorted, perm, weights, *, tuning: Tuning):
    op = "moe_unpermute"
    check_tensor(op, "y_sorted", y_sorted, ndim=2, dtypes=FLOAT_DTYPES)
    check_weights(op, weights, None)
    rows, k = weights.shape
    check_tensor(op, "y_sorted", y_sorted, shape=(rows * k, None))
    check_tensor(op, "perm", perm, shape=(rows * k,), dtypes=(torch.int64,))
    check_same_device(op, y_sorted=y_sorted, perm=perm, weights=weights)
    pairs = rows * k
    inv = torch.empty(pairs, dtype=torch.int32, device=y_sorted.device)
    if pairs:
        meta, launch = _params(tuning, "moe_permute")
        block = min(int(meta["BLOCK_P"]), _pow2(pairs))
        kern._invert_kernel[(triton.cdiv(pairs, block),)](perm, inv, pairs, perm.stride(0), BLOCK=block, **launch)
    return _combine(y_sorted, inv, weights, tuning)


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
    tuning: Tuning,
):
    opts = (w13_scale, w2_scale, act_quant, act_scale_fmt, w13_zero_point, w2_zero_point, group_size)
    k = int4.check_int4_moe(x, w13, w2, weights, ids, activation, alpha, limit, w13_bias, w2_bias, opts)
    packed = k is not None  # W4A16 experts (spec 1.9): the same composition with the int4 grouped GEMMs
    if not packed:
        k = check_fused("fused_moe", x, w13, w2, weights, ids, activation, alpha, limit, w13_bias, w2_bias)
        forms = check_fused_moe_quant("fused_moe", w13, w2, w13_scale, w2_scale, act_quant, act_scale_fmt)
    check_same_device("fused_moe", x=x, w13_scale=w13_scale, w2_scale=w2_scale)
    rows, hidden = x.shape
    pairs = rows * k
    if pairs == 0:
        return x.new_empty(rows, hidden)
    flat_ids = ids.reshape(-1).contiguous()
    perm, ends, inv = _sort_pairs(flat_ids, w13.shape[0], tuning, want_inv=True)
    act = (ACTIVATIONS.index(activation), alpha, 0.0 if limit is None else limit)
    if packed:
        y_sorted = int4.int4_experts(x, w13, w2, opts, int(group_size), ends, perm, k, act, w13_bias, w2_bias, tuning)
        return _combine(y_sorted, inv, weights, tuning)
    if forms is not None:
        y_sorted = quant_experts(
            x,
            w13,
            w2,
            w13_scale,
            w2_scale,
            forms,
            ends,
            perm,
            k,
            act,
            w13_bias,
            w2_bias,
            act_quant,
            act_scale_fmt,
            tuning,
        )
        return _combine(y_sorted, inv, weights, tuning)
    h = x.new_empty(pairs, w13.shape[1] // 2)  # bias, rounding, activation and rounding in the first GEMM's epilogue
    launch_grouped(
        x, w13, ends, h, tuning=tuning, kernel="fused_moe", perm=perm, topk=k, swiglu=True, act=act, bias=w13_bias
    )
    y_sorted = x.new_empty(pairs, hidden)
    launch_grouped(h, w2, ends, y_sorted, tuning=tuning, kernel="fused_moe", bias=w2_bias)
    return _combine(y_sorted, inv, weights, tuning)
