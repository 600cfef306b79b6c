"""vLLM's ``Fp8MoEMethod`` on hetero ``fused_moe`` with its fp8 scale arguments, the experts kept as loaded.

vLLM converts fp8 experts into its kernel's format at load (``make_fp8_moe_kernel``).
This method keeps ``w13`` float8_e4m3fn [E, 2I, H] (gate rows, then up rows) and ``w2``
[E, H, I] with their float32 scales as vLLM's loader filled them, which is hetero
``fused_moe``'s form:

- block fp8: ``w13_weight_scale_inv`` [E, 2I/128, ceil(H/128)] and ``w2_weight_scale_inv``
  [E, ceil(H/128), I/128]; activations quantized per token and 128 columns ("group128");
- per-tensor fp8: ``w13_weight_scale`` [E, 2] (gate, up) expanded at load to per channel
  [E, 2I, 1] (exact); ``w2_weight_scale`` [E], one per expert; activations per token.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.quantization.fp8 import Fp8MoEMethod
from vllm.model_executor.utils import replace_parameter

from hetero_vllm import moe, report, torch_ops  # noqa: F401  (torch_ops defines torch.ops.hetero.fused_moe)

__all__ = ["MOE_SITE", "HeteroFp8MoEMethod", "unsupported"]

#: The vLLM class this route replaces: the report's name for it, and its custom_ops opt-out (``-Fp8MoEMethod``).
MOE_SITE = "Fp8MoEMethod"


def unsupported(method) -> str | None:
    """Why hetero cannot serve the experts of an ``Fp8MoEMethod`` (its block shape known); None: it can."""
    reason = moe.unsupported(method.moe)
    if reason is not None:
        return reason
    if method.moe.activation.value != "silu":
        return "fp8 experts with an interleaved activation (only silu's gate/up halves are routed)"
    if method.quant_config.activation_scheme != "dynamic":
        return "static activation scales: no hetero op quantizes with a given scale"
    if method.block_quant and (list(method.moe_block_shape) != [128, 128] or method.weight_scale_refine is not None):
        return f"expert block shape {method.moe_block_shape} (hetero fused_moe takes 128x128 blocks)"
    return None


class HeteroFp8MoEMethod(Fp8MoEMethod):
    """vLLM's fp8 MoE method (block or per-tensor experts, dynamic activations) on hetero ``fused_moe``."""

    supports_pre_processed_weights = False  # the per-tensor scales are expanded at load

    def __init__(self, quant_config, layer, act_scale_fmt: str = "float") -> None:
        super().__init__(quant_config, layer)
        self.act_scale_fmt = act_scale_fmt
        self.act_quant = "group128" if self.block_quant else "token"
        self.hetero_reason = unsupported(self)  # the config then returns vLLM's own method instead
        self.hetero_site: str | None = report.site(MOE_SITE) if self.hetero_reason is None else None

    @property
    def is_monolithic(self) -> bool:
        return False  # vLLM's router picks the experts; hetero runs them

    def process_weights_after_loading(self, layer) -> None:
        if not self.block_quant:
            inter = layer.w13_weight.shape[1] // 2
            scale = layer.w13_weight_scale.data.to(torch.float32)
            replace_parameter(layer, "w13_weight_scale", scale.repeat_interleave(inter, dim=1).unsqueeze(-1))

    def get_fused_moe_quant_config(self, layer):
        return None  # no vLLM kernel runs these experts

    def apply(self, layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input):
        suffix = "weight_scale_inv" if self.block_quant else "weight_scale"
        activation, alpha, limit = moe.activation_args(self.moe)
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
            getattr(layer, f"w13_{suffix}"),
            getattr(layer, f"w2_{suffix}"),
            self.act_quant,
            self.act_scale_fmt,
        )
