"""Mixture-of-experts operators: routing, permutation by expert, and the fused expert MLP.

M tokens, hidden size H, E experts of intermediate size I, top-k slots per token.
Expert ids are int32; routing weights are float32.
"""

from __future__ import annotations

import torch

from hetero.spec._op import Output, spec_op
from hetero.spec.comm import Communicator
from hetero.spec.types import EPDispatch

__all__ = [
    "route",
    "moe_permute",
    "moe_unpermute",
    "fused_moe",
    "ep_dispatch",
    "ep_combine",
    "SCORING",
    "ACTIVATIONS",
    "ACT_QUANT",
]

SCORING = ("softmax", "sigmoid", "sqrtsoftplus")
#: fused_moe's activation quantization schemes (``act_quant``; None: none).
ACT_QUANT = ("group128", "token")
#: fused_moe's expert activations on the [gate | up] halves (see ``fused_moe``).
ACTIVATIONS = ("silu", "swigluoai", "swiglu_clamp")


@spec_op(returns=("weights", Output("ids", "row_set", reorders=("weights",))))
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
    """Pick each token's top-k experts and their weights.

    router_logits [M, E], any floating dtype (computed in float32 or wider).

    1. ``scores = softmax(logits)``, ``sigmoid(logits)`` or ``sqrt(softplus(logits))``
       (``scoring``; "sqrtsoftplus" is spec 1.8, DeepSeek-V4).
    2. Selection scores: ``scores + correction_bias`` (float32 [E]) when given,
       else ``scores``. The bias only selects; it never enters a weight.
    3. With ``n_group > 1`` (must divide E): the experts form n_group equal
       groups; a group's score is the sum of its two largest selection scores when
       ``correction_bias`` is given (DeepSeek-V3), else its largest score
       (DeepSeek-V2). Only the ``topk_group`` best groups stay; the other experts'
       selection scores become -inf.
    4. ``ids`` = the top_k experts by selection score, in descending order.
    5. ``weights = scores[ids]`` (unbiased), divided by their sum when
       ``renormalize``, then multiplied by ``routed_scaling_factor``.

    ``fixed_ids`` int32 (or int64) [M, top_k], each in [0, E) (spec 1.8; None: scored): the
    experts are given, not selected: steps 2-4 are skipped and ``ids = fixed_ids`` in their
    order; step 5 weights them as above. It takes no ``correction_bias`` and ``n_group`` 1.
    DeepSeek-V4's hash-routed layers pass ``tid2eid[token_ids]``.

    Qwen3-MoE: softmax, renormalize = norm_topk_prob. DeepSeek-V3: sigmoid,
    n_group 8, topk_group 4, correction bias, renormalize, factor 2.5. DeepSeek-V4:
    sqrtsoftplus, correction bias (hash layers: fixed_ids), renormalize, factor 1.5.
    Returns (weights float32 [M, top_k], ids int32 [M, top_k]).
    """


@spec_op(returns=(Output("x_sorted", "exact"), Output("group_ends", "exact"), Output("perm", "exact")))
def moe_permute(
    x: torch.Tensor, ids: torch.Tensor, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort the (token, slot) pairs by expert so each expert's rows are contiguous.

    x [M, H]; ids int32 [M, k], each in [0, num_experts). The pair (m, s) has the
    flat index ``m * k + s``; pairs are sorted by expert id, stably (ties keep
    flat order). Returns x_sorted [M*k, H] (row r is ``x[perm[r] // k]``),
    group_ends int32 [num_experts] (cumulative row counts per expert, the
    ``grouped_gemm`` form) and perm int64 [M*k] (the flat pair index of each row).
    """


@spec_op(returns=("out",))
def moe_unpermute(y_sorted: torch.Tensor, perm: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Gather the expert outputs back to their tokens and sum them with the routing weights.

    y_sorted [M*k, H] in the order of ``moe_permute``; perm int64 [M*k] from it;
    weights float32 [M, k]. ``y[m] = sum_s weights[m, s] * y_sorted[r]`` where
    ``perm[r] = m * k + s``, accumulated in float32 or wider. Returns [M, H] in
    y_sorted's dtype.
    """


@spec_op(returns=("out",))
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
    """The routed expert MLP of a MoE layer, summed over each token's experts.

    x [M, H]; w13 [E, 2I, H] with the gate projection in rows [0, I) and the up
    projection in rows [I, 2I); w2 [E, H, I]; weights float32 [M, k]; ids int32
    [M, k]; w13_bias [E, 2I] and w2_bias [E, H] of x's dtype, or None. For token m
    and slot s with ``e = ids[m, s]``::

        gu   = r(w13[e] @ x_m + w13_bias[e])         # [2I]: gate = gu[:I], up = gu[I:]
        h    = r(act(gate, up))                      # [I]
        y    = r(w2[e] @ h + w2_bias[e])             # [H]
        out[m] = sum_s weights[m, s] * y             # float32 or wider, then rounded

    where r() rounds to x's dtype (as a composition of ``moe_permute``,
    ``grouped_gemm``, the activation, ``grouped_gemm`` and ``moe_unpermute``
    would; a bias is added in float32 before its rounding; a missing bias is 0), and
    ``act`` is evaluated in float32 or wider:

    - ``"silu"``: ``silu(gate) * up`` (Qwen, DeepSeek); ``limit`` must be None.
    - ``"swigluoai"`` (gpt-oss, alpha 1.702, limit 7.0): ``g = min(gate, limit)``,
      ``u = clamp(up, -limit, limit)``, ``(u + 1) * g * sigmoid(alpha * g)``.
      gpt-oss checkpoints interleave gate and up columns; the caller splits them into halves at load.
    - ``"swiglu_clamp"`` (DeepSeek-V4, limit 10.0): ``silu(min(gate, limit)) * clamp(up, -limit, limit)``.

    The clamped activations need a finite ``limit`` > 0; ``alpha`` must be finite and
    only enters swigluoai. Returns [M, H] in x's dtype.

    Quantized experts (spec 1.4): w13 and w2 float8_e4m3fn, float8_e4m3fnuz or int8 with float32
    ``w13_scale`` and ``w2_scale`` in a form of ``scaled_grouped_gemm``'s b_scale
    ([E, ceil(2I/128), ceil(H/128)] and [E, ceil(H/128), ceil(I/128)] blocks, [E, 2I, 1] and
    [E, H, 1] per channel, or [E]); quantized weights require both, float weights take neither.
    ``act_quant`` says how each GEMM's input is quantized first, with ``quantize_activation`` into
    the weights' dtype (scale format ``act_scale_fmt``): "group128" (group_size 128) or "token"
    (group_size None). The composition is then::

        gu = r(scaled_grouped_gemm(quantize(x), w13, ...) + w13_bias)
        h  = r(act(gate, up))
        y  = r(scaled_grouped_gemm(quantize(h), w2, ...) + w2_bias)

    where each product is scaled_grouped_gemm's float32 (or wider) result before its rounding, so
    the bias joins it and r() rounds once.
    ``act_quant`` None with quantized weights (weight-only, W8A16) multiplies x by the dequantized
    weights (``w * scale``) in float32 or wider instead. ``act_quant`` without quantized weights
    is an OpError.

    Packed int4 experts (spec 1.9, W4A16): w13 uint8 [E, 2I, ceil(H/2)] and w2 uint8
    [E, H, ceil(I/2)] in ``gemm``'s packed encoding (I is w13.shape[1] // 2), with ``group_size``,
    float32 ``w13_scale`` [E, 2I, ceil(H/group_size)] and ``w2_scale`` [E, H, ceil(I/group_size)],
    and optional uint8 ``w13_zero_point`` / ``w2_zero_point`` of their scales' shapes (None: 8). The
    composition is the weight-only one above with ``gemm``'s bit-exact dequantization; ``act_quant``
    must be None. Zero points and group_size with any other weights are an OpError.
    """


@spec_op(returns=(Output("dispatch", "exact"),), collective=True)
def ep_dispatch(
    x: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    *,
    num_experts: int,
    comm: Communicator,
) -> EPDispatch:
    """Expert parallelism, first half: send each token to the ranks that hold its experts.

    A collective: every rank of ``comm`` calls it. x [M, H] (this rank's tokens;
    M = 0 is legal), ids int32 [M, k] in [0, num_experts), weights float32 [M, k]
    (from ``route``). With R = ``comm.world_size``, rank r owns the experts
    ``[r*E/R, (r+1)*E/R)``; ``num_experts % R != 0`` is an OpError.

    1. The ranks first exchange counts (how many tokens each sends to each).
    2. ONE ``all_to_all`` then carries the tokens, each token sent once to each
       rank holding at least one of its experts (not once per expert), together
       with its routing weights and local expert ids for that rank.
    3. The receiving rank expands them to one row per (token, local expert) pair,
       grouped by local expert.

    Returns an :class:`~hetero.spec.types.EPDispatch`: ``x`` [P, H] and
    ``group_ends`` int32 [E/R] are ready for ``grouped_gemm`` with the local
    experts' weights; the rest is the routing state ``ep_combine`` needs. A rank
    with no tokens, and an expert with no tokens, are legal.
    """


@spec_op(returns=("out",), collective=True)
def ep_combine(y_local: torch.Tensor, dispatch: EPDispatch) -> torch.Tensor:
    """Expert parallelism, second half: return each token's weighted expert sum to its source rank.

    A collective: every rank calls it with its own ``ep_dispatch`` result.
    y_local [P, H]: the local experts' outputs, row for row as ``dispatch.x``.
    The expert rank multiplies each pair's row by its routing weight and sums the
    pairs of each token (float32 or wider), sends these partial sums back with one
    ``all_to_all``, and the source rank sums the partials of each of its tokens.
    Returns [M, H] in y_local's dtype: on the concatenation of all ranks' batches
    it equals ``fused_moe``'s weighted sum (up to summation order); a token's
    row is zero if it has no expert (k = 0).
    """
