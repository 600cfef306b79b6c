"""DeepSeek-V2 and DeepSeek-V3 (also R1 and V3-architecture checkpoints): MLA attention, dense then MoE layers.

Mirrors transformers' modeling_deepseek_v2.py / modeling_deepseek_v3.py:

- layers ``[0, first_k_dense_replace)`` have a dense SwiGLU MLP, the rest a MoE block:
  router ``gate`` (float32 weight, hidden upcast to float32, logits in float32),
  routed experts (``FusedMoE``) plus shared experts (a dense MLP of
  ``n_shared_experts * moe_intermediate_size``) added to the routed output;
- V3 routing: sigmoid scores, ``e_score_correction_bias`` for selection only, group
  score = sum of the top-2 biased scores, ``topk_group`` of ``n_group`` groups kept
  (the rest -inf), weights from unbiased scores renormalized when ``norm_topk_prob``,
  times ``routed_scaling_factor``;
- V2 routing: softmax scores, ``topk_method`` "greedy" (no groups) or
  "group_limited_greedy" (group score = the group's max), weights times
  ``routed_scaling_factor``; transformers 5.24 never renormalizes V2 weights
  (``norm_topk_prob`` is unused there), hetero renormalizes when it is true (as
  DeepSeek's and vLLM's V2 code do); released V2 checkpoints all have it false;
- rope: interleaved pairs for V2 always and for V3 when ``rope_interleave``.

Checkpoint layers at index >= ``num_hidden_layers`` (the multi-token-prediction
layers, ``num_nextn_predict_layers`` of them) are ignored. Every module gets its
checkpoint ``prefix`` and the model's ``quant_config`` (which picks each Linear's and
FusedMoE's method by prefix).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.activation import SiluAndMul
from hetero.engine.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from hetero.engine.layers.linear import MergedColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from hetero.engine.layers.mla import MLAttention
from hetero.engine.layers.moe import FusedMoE, Routing
from hetero.engine.layers.norm import RMSNorm
from hetero.engine.layers.rotary import RotaryEmbedding
from hetero.engine.layers.weights import join_prefix
from hetero.engine.models.base import CausalLM, WeightMapping
from hetero.engine.quant.config import QuantConfig, quant_config_of
from hetero.engine.step import Step

__all__ = ["DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "deepseek_routing"]

_EXPERTS = WeightMapping.stacked_experts()
_PACKED = (("gate_proj", "gate_up_proj", 0), ("up_proj", "gate_up_proj", 1))
_IGNORE = (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq", r"model\.rotary_emb\.inv_freq")


def deepseek_routing(hf_config: Any, v3: bool) -> Routing:
    """The ``route`` arguments of a DeepSeek MoE layer (see the module docstring)."""
    c = hf_config
    if v3:
        return Routing(top_k=c.num_experts_per_tok, scoring="sigmoid", renormalize=bool(c.norm_topk_prob),
                       n_group=int(c.n_group or 1), topk_group=int(c.topk_group or 1),
                       routed_scaling_factor=float(c.routed_scaling_factor))
    method = getattr(c, "topk_method", "greedy")
    if method == "greedy":
        n_group, topk_group = 1, 1
    elif method == "group_limited_greedy":
        n_group, topk_group = int(c.n_group), int(c.topk_group)
    else:
        raise ValueError(f"DeepSeek-V2 topk_method {method!r} is not supported (greedy, group_limited_greedy)")
    return Routing(top_k=c.num_experts_per_tok, scoring="softmax", renormalize=bool(getattr(c, "norm_topk_prob", False)),
                   n_group=n_group, topk_group=topk_group, routed_scaling_factor=float(c.routed_scaling_factor))


class DeepseekMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), gate and up packed column-parallel, down row-parallel."""

    def __init__(self, ctx: ModelContext, hidden: int, intermediate: int, *, bias: bool = False, prefix: str = "",
                 quant_config: QuantConfig | None = None):
        super().__init__()
        self.prefix = prefix
        self.gate_up_proj = MergedColumnParallelLinear(ctx, hidden, [intermediate, intermediate], bias=bias,
                                                       prefix=join_prefix(prefix, "gate_up_proj"), quant_config=quant_config)
        self.act = SiluAndMul(ctx)
        self.down_proj = RowParallelLinear(ctx, intermediate, hidden, bias=bias, prefix=join_prefix(prefix, "down_proj"),
                                           quant_config=quant_config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class DeepseekMoE(nn.Module):
    """Router ``gate`` in float32, routed experts, shared experts; returns their sum.

    V3's ``e_score_correction_bias`` is the FusedMoE's ``correction_bias`` Parameter,
    registered first under ``gate.e_score_correction_bias`` (the checkpoint's name) so
    the loader fills it directly.
    """

    def __init__(self, ctx: ModelContext, hf_config: Any, v3: bool, *, prefix: str = "",
                 quant_config: QuantConfig | None = None):
        super().__init__()
        c, self.prefix = hf_config, prefix
        self.gate = ReplicatedLinear(dataclasses.replace(ctx, dtype=torch.float32), c.hidden_size, c.n_routed_experts,
                                     prefix=join_prefix(prefix, "gate"), quant_config=quant_config)
        self.experts = FusedMoE(ctx, c.n_routed_experts, c.hidden_size, c.moe_intermediate_size,
                                deepseek_routing(c, v3), correction_bias=v3, prefix=join_prefix(prefix, "experts"),
                                quant_config=quant_config)
        if v3:
            self.gate.e_score_correction_bias = self.experts.correction_bias
        self.shared_experts = None
        if c.n_shared_experts:
            self.shared_experts = DeepseekMLP(ctx, c.hidden_size, c.moe_intermediate_size * c.n_shared_experts,
                                              bias=bool(getattr(c, "mlp_bias", False)) and not v3,
                                              prefix=join_prefix(prefix, "shared_experts"), quant_config=quant_config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.gate(x.float())
        out = self.experts(x, logits)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out


class DeepseekDecoderLayer(nn.Module):
    def __init__(self, ctx: ModelContext, hf_config: Any, layer: int, rotary: RotaryEmbedding, v3: bool, *,
                 prefix: str = "", quant_config: QuantConfig | None = None):
        super().__init__()
        c, self.prefix = hf_config, prefix
        q = dict(quant_config=quant_config)
        self.self_attn = MLAttention(ctx, c, rotary, prefix=join_prefix(prefix, "self_attn"), **q)
        if layer >= c.first_k_dense_replace:
            self.mlp = DeepseekMoE(ctx, c, v3, prefix=join_prefix(prefix, "mlp"), **q)
        else:
            bias = bool(getattr(c, "mlp_bias", False)) and not v3
            self.mlp = DeepseekMLP(ctx, c.hidden_size, c.intermediate_size, bias=bias, prefix=join_prefix(prefix, "mlp"), **q)
        self.input_layernorm = RMSNorm(ctx, c.hidden_size, c.rms_norm_eps, prefix=join_prefix(prefix, "input_layernorm"))
        self.post_attention_layernorm = RMSNorm(ctx, c.hidden_size, c.rms_norm_eps,
                                                prefix=join_prefix(prefix, "post_attention_layernorm"))

    def forward(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        """x: the residual stream in; returns the residual stream out."""
        attn = self.self_attn(self.input_layernorm(x), step)
        h, x = self.post_attention_layernorm(attn, residual=x)
        return x + self.mlp(h)


_MAPPING = WeightMapping(packed=_PACKED, experts=_EXPERTS, ignore=_IGNORE)


class _DeepseekForCausalLM(CausalLM):
    #: the mapping without MTP layers; an instance carries its config's (``weight_mapping``)
    mapping = _MAPPING
    v3: bool = True

    def __init__(self, hf_config: Any, ctx: ModelContext, *, quant_config: QuantConfig | None = None):
        super().__init__()
        c = hf_config
        if c.num_key_value_heads not in (None, c.num_attention_heads):
            raise ValueError(f"{type(self).__name__}: MLA needs num_key_value_heads == num_attention_heads, "
                             f"the config has {c.num_key_value_heads} and {c.num_attention_heads}")
        self.ctx, self.config = ctx, c
        self.quant_config = quant = quant_config or quant_config_of(c)
        interleaved = bool(getattr(c, "rope_interleave", True)) if self.v3 else True
        rotary = RotaryEmbedding(ctx, c, c.qk_rope_head_dim, c.max_position_embeddings, is_neox=not interleaved)
        self.model = nn.Module()
        self.model.embed_tokens = VocabParallelEmbedding(ctx, c.vocab_size, c.hidden_size, prefix="model.embed_tokens")
        self.model.layers = nn.ModuleList(self.make_layer(ctx, c, i, rotary, quant) for i in range(c.num_hidden_layers))
        self.model.norm = RMSNorm(ctx, c.hidden_size, c.rms_norm_eps, prefix="model.norm")
        self.lm_head = ParallelLMHead(ctx, c.vocab_size, c.hidden_size, prefix="lm_head")
        if getattr(c, "tie_word_embeddings", False):
            self.lm_head.tie(self.model.embed_tokens)
        self.mapping = self.weight_mapping(c)

    def make_layer(self, ctx: ModelContext, hf_config: Any, layer: int, rotary: RotaryEmbedding,
                   quant_config: QuantConfig) -> nn.Module:
        """Decoder layer ``layer``; ``rotary`` is the model's table (a layer takes twins of it)."""
        return DeepseekDecoderLayer(ctx, hf_config, layer, rotary.twin(ctx), self.v3, prefix=f"model.layers.{layer}",
                                    quant_config=quant_config)

    @staticmethod
    def weight_mapping(hf_config: Any) -> WeightMapping:
        """Packed gate/up, stacked experts, and the MTP layers past num_hidden_layers ignored."""
        n = hf_config.num_hidden_layers
        extra = int(getattr(hf_config, "num_nextn_predict_layers", None) or getattr(hf_config, "num_mtp_layers", 0) or 0)
        ignore = _IGNORE + tuple(rf"model\.layers\.{i}\..*" for i in range(n, n + extra))
        return WeightMapping(packed=_PACKED, experts=_EXPERTS, ignore=ignore)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, step: Step,
                capture: list[torch.Tensor] | None = None) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)
        if capture is not None:
            capture.append(x)
        for layer in self.model.layers:
            x = layer(x, step)
            if capture is not None:
                capture.append(x)
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()


class DeepseekV2ForCausalLM(_DeepseekForCausalLM):
    v3 = False


class DeepseekV3ForCausalLM(_DeepseekForCausalLM):
    v3 = True

