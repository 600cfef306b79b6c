"""UnquantizedFusedMoEMethod on hetero ``fused_moe``, with the expert weights as loaded (biases included).

vLLM's CPU and CUDA MoE backends repack ``w13``/``w2`` for their own kernels in
``process_weights_after_loading``. The replacement selects vLLM's OOT backend
instead, which leaves ``w13 [E, 2I, H]`` (gate rows, then up rows) and
``w2 [E, H, I]`` as loaded: hetero ``fused_moe``'s layout. vLLM's router has already
picked ``topk_weights``/``topk_ids``; shared experts stay with vLLM's MoE runner.

Routed activations: ``silu`` and gpt-oss's ``swigluoai``. vLLM keeps a swigluoai
layer's gate and up rows interleaved (gate0, up0, gate1, ...); hetero wants the
halves, so ``w13`` and ``w13_bias`` are de-interleaved once, in place, at load.
Expert biases (``w13_bias [E, 2I]``, ``w2_bias [E, H]``) go to hetero as they are.

Expert parallelism (``enable_expert_parallel``): each rank holds ``w13``/``w2`` of its local
experts only, and vLLM's MoE runner brings the tokens to the experts itself: with TP x EP every
rank already has every token (its output is all-reduced after), with DP x EP the EP group's
all2all manager gathers them first and reduce-scatters the output after (on CPU,
``AgRsAll2AllManager``). The method receives global expert ids; ``layer.expert_map`` maps them
to local ids (-1: another rank's expert). hetero ``fused_moe`` takes ids in [0, E_local) only,
so the EP path runs its own opaque op, ``hetero::fused_moe_ep``: it keeps the tokens with at
least one local expert, moves each token's local slots first and trims k to the most local
slots any kept token has; a remaining slot of another rank becomes local expert 0 with weight 0
(``local_routing``), adding 0 * (a finite expert output), exactly nothing, to the token's sum.
The other tokens' rows are 0 (their experts are elsewhere). EPLB stays with vLLM.
"""

from __future__ import annotations

import torch

from hetero_vllm import report, torch_ops  # noqa: F401  (torch_ops defines torch.ops.hetero.*)
from hetero_vllm._oot import AlwaysOn, dispatch_to, register_oot

__all__ = [
    "SWIGLUOAI_DEFAULTS",
    "activation_args",
    "deinterleave",
    "fused_moe_ep",
    "local_routing",
    "register",
    "unsupported",
]

_SITE = "UnquantizedFusedMoEMethod"
#: swigluoai's (alpha, limit) when the FusedMoEConfig gives none: the values vLLM's own kernels use for gpt-oss.
SWIGLUOAI_DEFAULTS = (1.702, 7.0)
#: FusedMoEConfig fields of activations hetero has no form for (per routed activation, those it does read).
_TUNING = ("swiglu_limit", "swiglu_alpha", "swiglu_beta", "activation_situ_beta", "activation_situ_linear_beta")
_READS = {"silu": (), "swigluoai": ("swiglu_limit", "swiglu_alpha")}


def unsupported(moe, expert_parallel: bool = False) -> str | None:
    """Why hetero ``fused_moe`` cannot serve a layer of this ``FusedMoEConfig`` (None: it can).

    ``expert_parallel``: the caller maps vLLM's global expert ids to its local experts
    (``local_routing``), so an EP layer is served; otherwise EP is refused."""
    act = moe.activation.value
    if act not in _READS:
        return f"activation {act!r} (routed: {', '.join(map(repr, _READS))})"
    tuned = [k for k in _TUNING if k not in _READS[act] and getattr(moe, k, None) is not None]
    if tuned:
        return f"a tuned {act} ({', '.join(tuned)})"
    if moe.is_lora_enabled:
        return "LoRA on the experts"
    parallel = moe.moe_parallel_config
    if not parallel.use_ep and moe.num_local_experts == moe.num_experts:
        return None
    if not expert_parallel:
        return "expert parallelism (this method does not map vLLM's global expert ids to its local experts)"
    if getattr(parallel, "enable_eplb", False):
        return "expert parallelism with EPLB (redundant experts rearranged at run time; not tested with hetero)"
    if moe.num_local_experts < 1:
        return "expert parallelism with no expert on this rank (more EP ranks than experts)"
    return None


def local_routing(
    expert_map: torch.Tensor | None, topk_weights: torch.Tensor, topk_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights float32 [M, k], ids int32 [M, k]) for hetero ``fused_moe`` over this rank's experts.

    ``expert_map`` int32 [E_global]: vLLM's global id -> local id, -1 for another rank's expert
    (None: no EP, the ids are local already). Another rank's slot becomes local expert 0 with weight 0.
    """
    weights, ids = topk_weights.to(torch.float32), topk_ids.to(torch.int32)
    if expert_map is None:
        return weights, ids
    local = expert_map[topk_ids.long()]
    mine = local >= 0
    return torch.where(mine, weights, 0.0), torch.where(mine, local, 0).to(torch.int32)


def _local_pairs(
    expert_map: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows int64 [M'], weights float32 [M', k'], local ids int32 [M', k']): the tokens with a local expert,
    their local slots first, k' the most local slots of any of them (the rest weight 0 on local expert 0)."""
    weights, local = local_routing(expert_map, weights, ids)
    mine = expert_map[ids.long()] >= 0
    rows = mine.any(dim=1).nonzero().squeeze(1)
    if rows.numel() == 0:
        return rows, weights[:0], local[:0]
    mine = mine[rows]
    order = torch.argsort((~mine).to(torch.int8), dim=1, stable=True)[:, : int(mine.sum(dim=1).max())]
    return rows, weights[rows].gather(1, order), local[rows].gather(1, order)


@torch.library.custom_op("hetero::fused_moe_ep", mutates_args=())
def fused_moe_ep(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    expert_map: torch.Tensor,
    activation: str,
    site: str,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    alpha: float = 1.702,
    limit: float | None = None,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    act_quant: str | None = None,
    act_scale_fmt: str = "float",
) -> torch.Tensor:
    """hetero ``fused_moe`` over this EP rank's experts: ``ids`` [M, k] are vLLM's global expert ids,
    ``expert_map`` int32 [E_global] maps them to the local experts of ``w13``/``w2`` (-1: another rank's).
    Returns [M, H]: each token's weighted sum over its local experts (0 for a token with none); the other
    arguments are ``torch.ops.hetero.fused_moe``'s."""
    out = torch.zeros_like(x)
    rows, local_weights, local_ids = _local_pairs(expert_map, weights, ids)
    if rows.numel() == 0:  # no token of this batch chose this rank's experts: nothing for hetero to run
        return out
    out[rows] = torch.ops.hetero.fused_moe(  # counts the call under ``site`` too
        x[rows],
        w13,
        w2,
        local_weights,
        local_ids,
        activation,
        site,
        w13_bias=w13_bias,
        w2_bias=w2_bias,
        alpha=alpha,
        limit=limit,
        w13_scale=w13_scale,
        w2_scale=w2_scale,
        act_quant=act_quant,
        act_scale_fmt=act_scale_fmt,
    )
    return out


@fused_moe_ep.register_fake
def _(
    x,
    w13,
    w2,
    weights,
    ids,
    expert_map,
    activation,
    site,
    w13_bias=None,
    w2_bias=None,
    alpha=1.702,
    limit=None,
    w13_scale=None,
    w2_scale=None,
    act_quant=None,
    act_scale_fmt="float",
):
    return torch.empty_like(x)


def activation_args(moe) -> tuple[str, float, float | None]:
    """(activation, alpha, limit) for hetero ``fused_moe`` of a layer ``unsupported`` accepts."""
    act = moe.activation.value
    if act == "swigluoai":
        alpha = moe.swiglu_alpha if moe.swiglu_alpha is not None else SWIGLUOAI_DEFAULTS[0]
        limit = moe.swiglu_limit if moe.swiglu_limit is not None else SWIGLUOAI_DEFAULTS[1]
        return act, float(alpha), float(limit)
    return act, SWIGLUOAI_DEFAULTS[0], None


def deinterleave(rows: torch.Tensor) -> torch.Tensor:
    """[E, 2I, ...] with gate and up rows interleaved -> [E, 2I, ...] with the gate rows, then the up rows."""
    return torch.cat((rows[:, 0::2], rows[:, 1::2]), dim=1)


def _method_class(base: type) -> type:
    from vllm.model_executor.layers.fused_moe.oracle.unquantized import (
        UnquantizedMoeBackend,
        select_unquantized_moe_backend,
    )

    class HeteroUnquantizedFusedMoEMethod(AlwaysOn, base):  # type: ignore[misc, valid-type]
        """vLLM's unquantized MoE method on hetero ``fused_moe`` (weights not repacked)."""

        def __init__(self, moe):
            super().__init__(moe)
            self.hetero_site: str | None = None
            self.hetero_reason = unsupported(moe, expert_parallel=True)
            if self.hetero_reason is None and not self.enabled():  # -UnquantizedFusedMoEMethod: vLLM's kernel
                self.hetero_reason = "turned off by compilation_config.custom_ops"
            if self.hetero_reason is None:
                self.hetero_site = report.site(_SITE)
                self.unquantized_backend, self.experts_cls = UnquantizedMoeBackend.OOT, None
                self.supports_pre_processed_weights = False  # processed weights would be de-interleaved twice

        def create_weights(self, layer, *args, **kwargs):
            if self.hetero_site is not None and layer.apply_router_weight_on_input:
                # known only now, with the layer: give the layer back to vLLM's kernel before its weights exist
                self.hetero_site = None
                self.hetero_reason = "router weights applied to the input (apply_router_weight_on_input)"
                self.unquantized_backend, self.experts_cls = select_unquantized_moe_backend(moe_config=self.moe)
            return super().create_weights(layer, *args, **kwargs)

        @property
        def is_monolithic(self) -> bool:
            return False if getattr(self, "hetero_site", None) is not None else super().is_monolithic

        def process_weights_after_loading(self, layer) -> None:
            super().process_weights_after_loading(layer)  # the OOT backend leaves the weights as loaded
            if self.hetero_site is not None and self.moe.activation.value == "swigluoai":
                layer.w13_weight.data.copy_(deinterleave(layer.w13_weight.data))
                if getattr(layer, "w13_bias", None) is not None:
                    layer.w13_bias.data.copy_(deinterleave(layer.w13_bias.data))

        def forward_hetero(self, layer, x, topk_weights, topk_ids, shared_experts=None, shared_experts_input=None):
            if self.hetero_site is None:
                return self.forward_native(layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input)
            activation, alpha, limit = activation_args(self.moe)
            expert_map = getattr(layer, "expert_map", None)
            if expert_map is not None:  # expert parallelism: global ids, this rank's experts
                return torch.ops.hetero.fused_moe_ep(
                    x,
                    layer.w13_weight,
                    layer.w2_weight,
                    topk_weights.to(torch.float32),
                    topk_ids,
                    expert_map,
                    activation,
                    self.hetero_site,
                    getattr(layer, "w13_bias", None),
                    getattr(layer, "w2_bias", None),
                    alpha,
                    limit,
                )
            return torch.ops.hetero.fused_moe(
                x,
                layer.w13_weight,
                layer.w2_weight,
                topk_weights.to(torch.float32),
                topk_ids.to(torch.int32),
                activation,
                self.hetero_site,
                getattr(layer, "w13_bias", None),
                getattr(layer, "w2_bias", None),
                alpha,
                limit,
            )

    return dispatch_to(HeteroUnquantizedFusedMoEMethod, "forward_hetero")


def register() -> list[str]:
    """Register the MoE method replacement; returns the vLLM class names now routed."""
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

    routes: list[str] = []
    register_oot(UnquantizedFusedMoEMethod, _method_class(UnquantizedFusedMoEMethod), routes)
    return routes
