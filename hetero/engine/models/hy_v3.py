"""Hy3 (``hy_v3``, Tencent's flagship MoE): Qwen3's attention (per-head q/k RMSNorm before rope) and plain
rope (the NTK-alpha base is baked into ``rope_theta``); ``mlp_layer_types`` says which layers are dense.

A sparse layer routes by sigmoid scores of float32 router logits (``mlp.router.gate``), chooses its experts by
score plus ``mlp.expert_bias`` (the bias only selects), renormalizes the chosen scores and multiplies them by
``router_scaling_factor``; a shared expert (``mlp.shared_mlp``, ``num_shared_experts`` experts wide) is added,
in float32 when ``enable_moe_fp32_combine``. Checkpoint layers past ``num_hidden_layers`` (the MTP layer)
are ignored here; ``build_mtp`` runs the first as a speculative draft (``mtp.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.linear import ReplicatedLinear
from hetero.engine.layers.moe import FusedMoE, Routing
from hetero.engine.layers.weights import join_prefix
from hetero.engine.models.base import WeightMapping
from hetero.engine.models.decoder import GATE_UP_PACKED, IGNORE, QKV_PACKED, DecoderForCausalLM, DecoderLayer, GatedMLP
from hetero.engine.models.deepseek import mtp_ignore
from hetero.engine.models.qwen3 import Qwen3Attention
from hetero.engine.quant.config import QuantConfig
from hetero.errors import UsageError

__all__ = ["HYV3Router", "HYV3SparseMoeBlock", "HYV3DecoderLayer", "HYV3ForCausalLM", "is_sparse_layer"]


def is_sparse_layer(config: Any, layer_idx: int) -> bool:
    """``mlp_layer_types[layer_idx]``: "sparse" (routed experts) or "dense"; anything else is refused."""
    kinds = config.mlp_layer_types
    if len(kinds) != config.num_hidden_layers or not set(kinds) <= {"dense", "sparse"}:
        raise UsageError(
            "mlp_layer_types must give 'dense' or 'sparse' for each layer",
            arg="mlp_layer_types",
            expected=f"{config.num_hidden_layers} entries of 'dense' / 'sparse'",
            got=kinds,
        )
    return kinds[layer_idx] == "sparse"


class HYV3Router(nn.Module):
    """``gate``: the float32 router weight; the logits are of the hidden state upcast to float32."""

    def __init__(self, ctx: ModelContext, hidden: int, experts: int, *, prefix: str, quant_config: QuantConfig | None):
        super().__init__()
        self.prefix = prefix
        fp32 = dataclasses.replace(ctx, dtype=torch.float32)
        self.gate = ReplicatedLinear(
            fp32, hidden, experts, prefix=join_prefix(prefix, "gate"), quant_config=quant_config
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(x.float())


class HYV3SparseMoeBlock(nn.Module):
    """Routed experts (sigmoid, selection-only ``expert_bias``, renormalized, scaled) plus ``shared_mlp``."""

    def __init__(self, ctx: ModelContext, config: Any, *, prefix: str = "", quant_config: QuantConfig | None = None):
        super().__init__()
        c, self.prefix = config, prefix
        self.fp32_combine = bool(c.enable_moe_fp32_combine)
        self.router = HYV3Router(
            ctx, c.hidden_size, c.num_experts, prefix=join_prefix(prefix, "router"), quant_config=quant_config
        )
        routing = Routing(
            top_k=c.num_experts_per_tok,
            scoring="sigmoid",
            renormalize=True,
            routed_scaling_factor=float(c.router_scaling_factor),
        )
        self.experts = FusedMoE(
            ctx,
            c.num_experts,
            c.hidden_size,
            c.moe_intermediate_size,
            routing,
            correction_bias=True,
            prefix=join_prefix(prefix, "experts"),
            quant_config=quant_config,
        )
        self.expert_bias = self.experts.correction_bias  # the checkpoint's name for it
        self.shared_mlp = GatedMLP(
            ctx,
            c.hidden_size,
            c.moe_intermediate_size * c.num_shared_experts,
            prefix=join_prefix(prefix, "shared_mlp"),
            quant_config=quant_config,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        routed, shared = self.experts(x, self.router(x)), self.shared_mlp(x)
        if self.fp32_combine:
            return (routed.float() + shared.float()).to(x.dtype)
        return routed + shared


class HYV3DecoderLayer(DecoderLayer):
    attention_cls = Qwen3Attention
    moe_cls = HYV3SparseMoeBlock
    is_moe_layer = staticmethod(is_sparse_layer)


class HYV3ForCausalLM(DecoderForCausalLM):
    """Hy3 (Hy3-preview); an instance's mapping also ignores its config's MTP layers."""

    layer_cls = HYV3DecoderLayer
    mapping = WeightMapping(packed=QKV_PACKED + GATE_UP_PACKED, experts=WeightMapping.stacked_experts(), ignore=IGNORE)

    def weight_mapping(self, hf_config: Any) -> WeightMapping:
        extra = mtp_ignore(hf_config) or (rf"model\.layers\.{hf_config.num_hidden_layers}\..*",)
        return dataclasses.replace(type(self).mapping, ignore=IGNORE + extra)

    def build_mtp(self, model_dir):
        """The checkpoint's MTP layer as a speculative draft sharing this model's embedding and head
        (``mtp.HYV3MTPDraft``)."""
        from hetero.engine.models.mtp import HYV3MTPDraft

        return HYV3MTPDraft(self).load(model_dir)
