"""UnquantizedFusedMoEMethod on hetero ``fused_moe``, with the expert weights exactly as loaded.

vLLM's CPU and CUDA MoE backends repack ``w13``/``w2`` for their own kernels in
``process_weights_after_loading``. The replacement selects vLLM's OOT backend
instead, which leaves ``w13 [E, 2I, H]`` (gate rows, then up rows) and
``w2 [E, H, I]`` as loaded: hetero ``fused_moe``'s layout. vLLM's router has already
picked ``topk_weights``/``topk_ids``; shared experts stay with vLLM's MoE runner.
"""

from __future__ import annotations

import torch

from hetero_vllm import report, torch_ops  # noqa: F401  (torch_ops defines torch.ops.hetero.*)
from hetero_vllm._oot import AlwaysOn, dispatch_to, register_oot

__all__ = ["register", "unsupported"]

_SITE = "UnquantizedFusedMoEMethod"


def unsupported(moe) -> str | None:
    """Why hetero ``fused_moe`` cannot serve a layer of this ``FusedMoEConfig`` (None: it can)."""
    if moe.activation.value != "silu":
        return f"activation {moe.activation.value!r} (routed: 'silu')"
    tuned = [
        k
        for k in ("swiglu_limit", "swiglu_alpha", "swiglu_beta", "activation_situ_beta", "activation_situ_linear_beta")
        if getattr(moe, k, None) is not None
    ]
    if tuned:
        return f"a tuned SwiGLU ({', '.join(tuned)})"
    if moe.has_bias:
        return "expert biases"
    if moe.is_lora_enabled:
        return "LoRA on the experts"
    if moe.moe_parallel_config.use_ep or moe.num_local_experts != moe.num_experts:
        return "expert parallelism (hetero ep_dispatch/ep_combine are not wired to vLLM yet)"
    return None


def _method_class(base: type) -> type:
    from vllm.model_executor.layers.fused_moe.oracle.unquantized import UnquantizedMoeBackend

    class HeteroUnquantizedFusedMoEMethod(AlwaysOn, base):  # type: ignore[misc, valid-type]
        """vLLM's unquantized MoE method on hetero ``fused_moe`` (weights not repacked)."""

        def __init__(self, moe):
            super().__init__(moe)
            self.hetero_reason = unsupported(moe)
            if self.hetero_reason is None:
                self.unquantized_backend, self.experts_cls = UnquantizedMoeBackend.OOT, None
            else:
                report.not_routed(f"{_SITE}[{self.hetero_reason}]", "kept vLLM's MoE kernel")

        @property
        def is_monolithic(self) -> bool:
            return False if getattr(self, "hetero_reason", None) is None else super().is_monolithic

        def forward_hetero(self, layer, x, topk_weights, topk_ids, shared_experts=None, shared_experts_input=None):
            if self.hetero_reason is None and layer.apply_router_weight_on_input:
                self.hetero_reason = "router weights applied to the input (apply_router_weight_on_input)"
                report.not_routed(f"{_SITE}[{self.hetero_reason}]", "kept vLLM's MoE path")
            if self.hetero_reason is not None:
                return self.forward_native(layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input)
            return torch.ops.hetero.fused_moe(
                x,
                layer.w13_weight,
                layer.w2_weight,
                topk_weights.to(torch.float32),
                topk_ids.to(torch.int32),
                "silu",
                _SITE,
            )

    return dispatch_to(HeteroUnquantizedFusedMoEMethod, "forward_hetero")


def register() -> list[str]:
    """Register the MoE method replacement; returns the vLLM class names now routed."""
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

    routes: list[str] = []
    register_oot(UnquantizedFusedMoEMethod, _method_class(UnquantizedFusedMoEMethod), routes)
    return routes
