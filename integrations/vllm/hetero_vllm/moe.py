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
"""

from __future__ import annotations

import torch

from hetero_vllm import report, torch_ops  # noqa: F401  (torch_ops defines torch.ops.hetero.*)
from hetero_vllm._oot import AlwaysOn, dispatch_to, register_oot

__all__ = ["SWIGLUOAI_DEFAULTS", "activation_args", "deinterleave", "register", "unsupported"]

_SITE = "UnquantizedFusedMoEMethod"
#: swigluoai's (alpha, limit) when the FusedMoEConfig gives none: the values vLLM's own kernels use for gpt-oss.
SWIGLUOAI_DEFAULTS = (1.702, 7.0)
#: FusedMoEConfig fields of activations hetero has no form for (per routed activation, those it does read).
_TUNING = ("swiglu_limit", "swiglu_alpha", "swiglu_beta", "activation_situ_beta", "activation_situ_linear_beta")
_READS = {"silu": (), "swigluoai": ("swiglu_limit", "swiglu_alpha")}


def unsupported(moe) -> str | None:
    """Why hetero ``fused_moe`` cannot serve a layer of this ``FusedMoEConfig`` (None: it can)."""
    act = moe.activation.value
    if act not in _READS:
        return f"activation {act!r} (routed: {', '.join(map(repr, _READS))})"
    tuned = [k for k in _TUNING if k not in _READS[act] and getattr(moe, k, None) is not None]
    if tuned:
        return f"a tuned {act} ({', '.join(tuned)})"
    if moe.is_lora_enabled:
        return "LoRA on the experts"
    if moe.moe_parallel_config.use_ep or moe.num_local_experts != moe.num_experts:
        return "expert parallelism (hetero ep_dispatch/ep_combine are not wired to vLLM yet)"
    return None


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
            self.hetero_reason = unsupported(moe)
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
