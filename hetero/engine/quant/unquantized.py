"""The unquantized methods: float weights in the model dtype, ``gemm`` and ``fused_moe`` / ``grouped_gemm``."""

from __future__ import annotations

import torch
from torch import nn

from hetero.engine.quant.base import LinearMethod, MoEMethod, clamp_gate_up, register_weight

__all__ = ["UnquantizedLinearMethod", "UnquantizedMoEMethod"]


class UnquantizedLinearMethod(LinearMethod):
    """``weight [out, in]`` in the layer's dtype, through the backend's ``gemm``."""

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int) -> None:
        register_weight(
            layer,
            "weight",
            layer.ctx.empty(out_features, in_features),
            loader=layer.load_weight,
            shards=layer.shard_ids,
            output_dim=0,
            input_dim=1,
        )
        layer.ctx.bind_op(layer, "_gemm", "gemm")

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return layer._gemm(x, layer.weight, bias=bias)

    def dense_weight(self, layer: nn.Module) -> torch.Tensor:
        return layer.weight.detach()


class UnquantizedMoEMethod(MoEMethod):
    """``w13 [E, 2I, H]`` (gate rows, then up rows) and ``w2 [E, H, I]`` in the model dtype.

    Tensor parallel: one ``fused_moe``; expert parallel: ``grouped_gemm``, ``silu_and_mul``, ``grouped_gemm``
    (``swiglu_clamp``: the gate and up halves clamped before ``silu_and_mul``, which is that activation).
    """

    activations = ("silu", "swiglu_clamp")

    def create_weights(self, layer: nn.Module, num_experts: int, hidden: int, intermediate: int) -> None:
        ctx = layer.ctx
        register_weight(
            layer,
            "w13",
            ctx.empty(num_experts, 2 * intermediate, hidden),
            loader=layer.load_expert,
            shards=layer.expert_shards(("gate", "up")),
        )
        register_weight(
            layer,
            "w2",
            ctx.empty(num_experts, hidden, intermediate),
            loader=layer.load_expert,
            shards=layer.expert_shards(("down",)),
        )
        if layer.ep:
            ctx.bind_op(layer, "_grouped_gemm", "grouped_gemm")
            ctx.bind_op(layer, "_silu_and_mul", "silu_and_mul")
        else:
            ctx.bind_op(layer, "_fused_moe", "fused_moe", activation=layer.activation)

    def apply(self, layer: nn.Module, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        if layer.activation == "silu":
            return layer._fused_moe(x, layer.w13, layer.w2, weights, ids)
        return layer._fused_moe(x, layer.w13, layer.w2, weights, ids, activation=layer.activation, limit=layer.limit)

    def apply_grouped(self, layer: nn.Module, x: torch.Tensor, group_ends: torch.Tensor) -> torch.Tensor:
        gate_up = layer._grouped_gemm(x, layer.w13, group_ends)
        if layer.activation == "swiglu_clamp":
            gate_up = clamp_gate_up(gate_up, layer.limit)
        h = layer._silu_and_mul(gate_up)
        return layer._grouped_gemm(h, layer.w2, group_ends)
