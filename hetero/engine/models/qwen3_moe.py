"""Qwen3-MoE: Qwen3 attention; MLP either a dense gated SiLU or routed experts per layer.

A layer is sparse when it is not in ``mlp_only_layers``, ``num_experts > 0`` and
``(layer + 1) % decoder_sparse_step == 0`` (as transformers decides). Its router
(``mlp.gate``, replicated) feeds ``route`` with softmax scoring, top
``num_experts_per_tok``, renormalized iff ``norm_topk_prob``; the experts are one
FusedMoE (``mlp.experts.w13`` / ``w2``) loaded from the per-expert checkpoint tensors.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.linear import ReplicatedLinear
from hetero.engine.layers.moe import FusedMoE, Routing
from hetero.engine.layers.weights import join_prefix
from hetero.engine.models.base import WeightMapping
from hetero.engine.models.decoder import GATE_UP_PACKED, IGNORE, QKV_PACKED, DecoderForCausalLM, DecoderLayer
from hetero.engine.models.qwen3 import Qwen3Attention
from hetero.engine.quant.config import QuantConfig

__all__ = ["Qwen3MoeSparseMoeBlock", "Qwen3MoeDecoderLayer", "Qwen3MoeForCausalLM", "is_sparse_layer"]


def is_sparse_layer(config: Any, layer_idx: int) -> bool:
    """Whether decoder layer ``layer_idx`` has routed experts (else a dense MLP of ``intermediate_size``)."""
    step = getattr(config, "decoder_sparse_step", 1) or 1
    return (
        layer_idx not in (getattr(config, "mlp_only_layers", None) or [])
        and config.num_experts > 0
        and (layer_idx + 1) % step == 0
    )


class Qwen3MoeSparseMoeBlock(nn.Module):
    """router_logits = gate(x); experts(x, router_logits) (the all_reduce / EP exchange is FusedMoE's)."""

    def __init__(self, ctx: ModelContext, config: Any, *, prefix: str = "", quant_config: QuantConfig | None = None):
        super().__init__()
        self.prefix = prefix
        self.gate = ReplicatedLinear(
            ctx, config.hidden_size, config.num_experts, prefix=join_prefix(prefix, "gate"), quant_config=quant_config
        )
        routing = Routing(top_k=config.num_experts_per_tok, scoring="softmax", renormalize=bool(config.norm_topk_prob))
        self.experts = FusedMoE(
            ctx,
            config.num_experts,
            config.hidden_size,
            config.moe_intermediate_size,
            routing,
            prefix=join_prefix(prefix, "experts"),
            quant_config=quant_config,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.experts(x, self.gate(x))


class Qwen3MoeDecoderLayer(DecoderLayer):
    attention_cls = Qwen3Attention
    moe_cls = Qwen3MoeSparseMoeBlock
    is_moe_layer = staticmethod(is_sparse_layer)


class Qwen3MoeForCausalLM(DecoderForCausalLM):
    """Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B and their tiny versions)."""

    layer_cls = Qwen3MoeDecoderLayer
    mapping = WeightMapping(packed=QKV_PACKED + GATE_UP_PACKED, experts=WeightMapping.stacked_experts(), ignore=IGNORE)
