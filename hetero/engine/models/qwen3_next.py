"""Qwen3-Next: hybrid decoder layers, Gated DeltaNet linear attention or gated full attention, by ``layer_types``.

Every layer is pre-norm with zero-centred RMSNorms (``norm(x) * (1 + w)``); its token mixer is
``linear_attn`` (a ``GatedDeltaNet``, per-sequence state) where ``layer_types[i]`` is
"linear_attention" and ``self_attn`` (a ``GatedAttention``, paged KV) where it is
"full_attention" (transformers derives ``layer_types`` from ``full_attention_interval``).
The MLP is routed experts plus a shared expert scaled by ``sigmoid(shared_expert_gate(x))``
where Qwen3-MoE's rule makes the layer sparse (``mlp_only_layers``, ``decoder_sparse_step``),
else a dense gated SiLU MLP. The checkpoint's input projections are Qwen3-Next's fused,
per-key-head interleaved ``in_proj_qkvz`` / ``in_proj_ba``; its MTP weights (``mtp.*``) are
ignored here and loaded by ``build_mtp`` as a speculative draft (``mtp.py``). The Qwen3.5 models
(``qwen3_5.py``) reuse all of this.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.gated_attention import GatedAttention, ZeroCenteredRMSNorm, rotary_dim_of
from hetero.engine.layers.gated_deltanet import GatedDeltaNet
from hetero.engine.layers.linear import ReplicatedLinear
from hetero.engine.layers.moe import FusedMoE, Routing
from hetero.engine.layers.rotary import RotaryEmbedding
from hetero.engine.layers.weights import join_prefix
from hetero.engine.models.base import WeightMapping
from hetero.engine.models.decoder import GATE_UP_PACKED, IGNORE, QKV_PACKED, DecoderForCausalLM, DecoderLayer, GatedMLP
from hetero.engine.models.qwen3_moe import is_sparse_layer
from hetero.engine.quant.config import QuantConfig

__all__ = ["HybridSparseMoeBlock", "Qwen3NextDecoderLayer", "Qwen3NextForCausalLM", "MTP_IGNORE", "LAYER_TYPES"]

#: the token mixers a hybrid layer may have (config.layer_types); anything else is an error
LAYER_TYPES = ("linear_attention", "full_attention")
#: the multi-token-prediction head the checkpoints carry and the engine does not run
MTP_IGNORE = (r"mtp\..*",)


class HybridSparseMoeBlock(nn.Module):
    """``experts(x, gate(x)) + sigmoid(shared_expert_gate(x)) * shared_expert(x)``.

    The router is softmax top-``num_experts_per_tok``, renormalized iff ``renormalize`` (None:
    iff the config's ``norm_topk_prob``); the shared expert is a gated SiLU MLP of
    ``shared_expert_intermediate_size``. The two parts reduce over the ranks separately
    (FusedMoE's and the row-parallel down_proj's).
    """

    def __init__(
        self,
        ctx: ModelContext,
        config: Any,
        *,
        renormalize: bool | None = None,
        prefix: str = "",
        quant_config: QuantConfig | None = None,
    ):
        super().__init__()
        self.prefix, hidden = prefix, config.hidden_size
        if renormalize is None:
            renormalize = bool(config.norm_topk_prob)
        self.gate = ReplicatedLinear(
            ctx, hidden, config.num_experts, prefix=join_prefix(prefix, "gate"), quant_config=quant_config
        )
        routing = Routing(top_k=config.num_experts_per_tok, scoring="softmax", renormalize=renormalize)
        self.experts = FusedMoE(
            ctx,
            config.num_experts,
            hidden,
            config.moe_intermediate_size,
            routing,
            prefix=join_prefix(prefix, "experts"),
            quant_config=quant_config,
        )
        self.shared_expert = GatedMLP(
            ctx,
            hidden,
            config.shared_expert_intermediate_size,
            prefix=join_prefix(prefix, "shared_expert"),
            quant_config=quant_config,
        )
        self.shared_expert_gate = ReplicatedLinear(
            ctx, hidden, 1, prefix=join_prefix(prefix, "shared_expert_gate"), quant_config=quant_config
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return self.experts(x, self.gate(x)) + shared


class Qwen3NextDecoderLayer(DecoderLayer):
    """A Gated DeltaNet (``linear_attn``) or a gated full attention (``self_attn``) by ``config.layer_types``.

    ``layout`` is the checkpoint layout of the Gated DeltaNet input projections (``gated_deltanet.LAYOUTS``).
    """

    attention_cls = GatedAttention
    moe_cls = HybridSparseMoeBlock
    is_moe_layer = staticmethod(is_sparse_layer)
    norm_cls = ZeroCenteredRMSNorm
    layout = "interleaved"

    @classmethod
    def rotary_table(cls, ctx: ModelContext, config: Any) -> RotaryEmbedding:
        """Partial NeoX rope: the first ``rotary_dim_of`` dims of each head."""
        return RotaryEmbedding(
            ctx, config, rotary_dim_of(config, config.head_dim), config.max_position_embeddings, is_neox=True
        )

    def make_mixer(
        self,
        ctx: ModelContext,
        config: Any,
        layer_idx: int,
        rotary: RotaryEmbedding,
        *,
        prefix: str,
        quant_config: QuantConfig | None,
    ) -> tuple[str, nn.Module]:
        kind = config.layer_types[layer_idx]
        if kind == "linear_attention":
            return "linear_attn", GatedDeltaNet(
                ctx, config, self.layout, prefix=join_prefix(prefix, "linear_attn"), quant_config=quant_config
            )
        if kind == "full_attention":
            return super().make_mixer(ctx, config, layer_idx, rotary, prefix=prefix, quant_config=quant_config)
        raise ValueError(f"layer_types[{layer_idx}] is {kind!r}; a hybrid Qwen layer is one of {LAYER_TYPES}")


class Qwen3NextForCausalLM(DecoderForCausalLM):
    """Qwen3-Next (Qwen3-Next-80B-A3B and its tiny versions): ``model.*`` plus ``lm_head``."""

    layer_cls = Qwen3NextDecoderLayer
    mapping = WeightMapping(
        packed=QKV_PACKED + GATE_UP_PACKED + (("in_proj_qkvz", "in_proj", "qkvz"), ("in_proj_ba", "in_proj", "ba")),
        experts=WeightMapping.stacked_experts(),
        ignore=IGNORE + MTP_IGNORE,
    )

    def build_mtp(self, model_dir):
        """The checkpoint's ``mtp.*`` layer as a speculative draft sharing this model's embedding and head
        (``mtp.QwenMTPDraft``)."""
        from hetero.engine.models.mtp import QwenMTPDraft

        return QwenMTPDraft(self).load(model_dir)
