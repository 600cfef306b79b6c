"""Qwen3-Next: hybrid decoder layers, Gated DeltaNet linear attention or gated full attention, by ``layer_types``.

Every layer is pre-norm with zero-centred RMSNorms (``norm(x) * (1 + w)``); its token mixer is
``linear_attn`` (a ``GatedDeltaNet``, per-sequence state) where ``layer_types[i]`` is
"linear_attention" and ``self_attn`` (a ``GatedAttention``, paged KV) where it is
"full_attention" (transformers derives ``layer_types`` from ``full_attention_interval``).
The MLP is routed experts plus a shared expert scaled by ``sigmoid(shared_expert_gate(x))``
where Qwen3-MoE's rule makes the layer sparse (``mlp_only_layers``, ``decoder_sparse_step``),
else a dense gated SiLU MLP. The checkpoint's input projections are Qwen3-Next's fused,
per-key-head interleaved ``in_proj_qkvz`` / ``in_proj_ba``; its MTP weights (``mtp.*``) are
not used. The Qwen3.5 models (``qwen3_5.py``) reuse all of this.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.embedding import VocabParallelEmbedding
from hetero.engine.layers.gated_attention import GatedAttention, ZeroCenteredRMSNorm, rotary_dim_of
from hetero.engine.layers.gated_deltanet import GatedDeltaNet
from hetero.engine.layers.linear import ReplicatedLinear
from hetero.engine.layers.moe import FusedMoE, Routing
from hetero.engine.layers.rotary import RotaryEmbedding
from hetero.engine.layers.weights import join_prefix
from hetero.engine.models.base import WeightMapping
from hetero.engine.models.qwen2 import (QWEN_IGNORE, QWEN_PACKED, PreNormDecoderLayer, Qwen2ForCausalLM, Qwen2MLP,
                                       Qwen2Model)
from hetero.engine.models.qwen3_moe import is_sparse_layer
from hetero.engine.quant.config import QuantConfig
from hetero.engine.step import Step

__all__ = ["HybridSparseMoeBlock", "Qwen3NextDecoderLayer", "Qwen3NextModel", "Qwen3NextForCausalLM",
           "MTP_IGNORE", "LAYER_TYPES"]

#: the token mixers a hybrid layer may have (config.layer_types); anything else is an error
LAYER_TYPES = ("linear_attention", "full_attention")
#: the multi-token-prediction head the checkpoints carry and the engine does not run
MTP_IGNORE = (r"mtp\..*",)


class HybridSparseMoeBlock(nn.Module):
    """``experts(x, gate(x)) + sigmoid(shared_expert_gate(x)) * shared_expert(x)``.

    The router is softmax top-``num_experts_per_tok``, renormalized iff ``renormalize``;
    the shared expert is a gated SiLU MLP of ``shared_expert_intermediate_size``. The two
    parts reduce over the ranks separately (FusedMoE's and the row-parallel down_proj's).
    """

    def __init__(self, ctx: ModelContext, config: Any, *, renormalize: bool, prefix: str = "",
                 quant_config: QuantConfig | None = None):
        super().__init__()
        self.prefix, hidden = prefix, config.hidden_size
        self.gate = ReplicatedLinear(ctx, hidden, config.num_experts, prefix=join_prefix(prefix, "gate"),
                                     quant_config=quant_config)
        routing = Routing(top_k=config.num_experts_per_tok, scoring="softmax", renormalize=renormalize)
        self.experts = FusedMoE(ctx, config.num_experts, hidden, config.moe_intermediate_size, routing,
                                prefix=join_prefix(prefix, "experts"), quant_config=quant_config)
        self.shared_expert = Qwen2MLP(ctx, hidden, config.shared_expert_intermediate_size,
                                      prefix=join_prefix(prefix, "shared_expert"), quant_config=quant_config)
        self.shared_expert_gate = ReplicatedLinear(ctx, hidden, 1, prefix=join_prefix(prefix, "shared_expert_gate"),
                                                   quant_config=quant_config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return self.experts(x, self.gate(x)) + shared


class Qwen3NextDecoderLayer(PreNormDecoderLayer):
    """A Gated DeltaNet or a gated full-attention layer by ``config.layer_types``, then the MLP.

    ``layout`` is the checkpoint layout of the Gated DeltaNet input projections
    (``gated_deltanet.LAYOUTS``); ``make_mlp`` builds the layer's MLP.
    """

    layout = "interleaved"

    def __init__(self, ctx: ModelContext, config: Any, layer_idx: int, rotary: RotaryEmbedding, *, prefix: str = "",
                 quant_config: QuantConfig | None = None):
        super().__init__()
        self.prefix = prefix
        self.layer_type = config.layer_types[layer_idx]
        if self.layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(ctx, config, self.layout, prefix=join_prefix(prefix, "linear_attn"),
                                             quant_config=quant_config)
        elif self.layer_type == "full_attention":
            self.self_attn = GatedAttention(ctx, config, rotary, prefix=join_prefix(prefix, "self_attn"),
                                            quant_config=quant_config)
        else:
            raise ValueError(f"layer_types[{layer_idx}] is {self.layer_type!r}; a hybrid Qwen layer is one of "
                             f"{LAYER_TYPES}")
        self.mlp = self.make_mlp(ctx, config, layer_idx, prefix=join_prefix(prefix, "mlp"), quant_config=quant_config)
        eps = config.rms_norm_eps
        self.input_layernorm = ZeroCenteredRMSNorm(ctx, config.hidden_size, eps,
                                                   prefix=join_prefix(prefix, "input_layernorm"))
        self.post_attention_layernorm = ZeroCenteredRMSNorm(ctx, config.hidden_size, eps,
                                                            prefix=join_prefix(prefix, "post_attention_layernorm"))

    def make_mlp(self, ctx: ModelContext, config: Any, layer_idx: int, *, prefix: str = "",
                 quant_config: QuantConfig | None = None) -> nn.Module:
        if is_sparse_layer(config, layer_idx):
            return HybridSparseMoeBlock(ctx, config, renormalize=bool(config.norm_topk_prob), prefix=prefix,
                                        quant_config=quant_config)
        return Qwen2MLP(ctx, config.hidden_size, config.intermediate_size, prefix=prefix, quant_config=quant_config)

    def mix(self, positions: torch.Tensor, hidden: torch.Tensor, step: Step) -> torch.Tensor:
        if self.layer_type == "linear_attention":
            return self.linear_attn(hidden, step)
        return self.self_attn(positions, hidden, step)


class Qwen3NextModel(nn.Module):
    """Embedding, hybrid decoder layers, zero-centred final norm (parameters under ``model.``).

    One partial-rope cos/sin table (``rotary_dim_of``), one module per layer over it.
    """

    layer_cls: type[Qwen3NextDecoderLayer] = Qwen3NextDecoderLayer

    def __init__(self, ctx: ModelContext, config: Any, *, prefix: str = "", quant_config: QuantConfig | None = None):
        super().__init__()
        self.prefix = prefix
        self.embed_tokens = VocabParallelEmbedding(ctx, config.vocab_size, config.hidden_size,
                                                   prefix=join_prefix(prefix, "embed_tokens"))
        rotary = RotaryEmbedding(ctx, config, rotary_dim_of(config, config.head_dim), config.max_position_embeddings,
                                 is_neox=True)
        self.layers = nn.ModuleList(self.layer_cls(ctx, config, i, rotary.twin(ctx), quant_config=quant_config,
                                                   prefix=join_prefix(prefix, f"layers.{i}"))
                                    for i in range(config.num_hidden_layers))
        self.norm = ZeroCenteredRMSNorm(ctx, config.hidden_size, config.rms_norm_eps, prefix=join_prefix(prefix, "norm"))

    # the same body as Qwen2's: embedding, every layer, the final norm adding the last residual
    forward = Qwen2Model.forward


class Qwen3NextForCausalLM(Qwen2ForCausalLM):
    """Qwen3-Next (Qwen3-Next-80B-A3B and its tiny versions): ``model.*`` plus ``lm_head``."""

    model_cls = Qwen3NextModel  # type: ignore[assignment]
    mapping = WeightMapping(packed=QWEN_PACKED + (("in_proj_qkvz", "in_proj", "qkvz"), ("in_proj_ba", "in_proj", "ba")),
                            experts=WeightMapping.stacked_experts(), ignore=QWEN_IGNORE + MTP_IGNORE)
