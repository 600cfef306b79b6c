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
layers, ``num_nextn_predict_layers`` of them) are ignored; V3's ``build_mtp`` runs the first as a
speculative draft (``mtp.py``). The rest is the decoder
skeleton (``decoder.py``): pre-norm layers, the residual fused into the next norm.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.linear import ReplicatedLinear
from hetero.engine.layers.mla import MLAttention
from hetero.engine.layers.moe import FusedMoE, Routing
from hetero.engine.layers.rotary import RotaryEmbedding
from hetero.engine.layers.weights import join_prefix
from hetero.engine.models.base import WeightMapping
from hetero.engine.models.decoder import GATE_UP_PACKED, IGNORE, DecoderForCausalLM, DecoderLayer, GatedMLP
from hetero.engine.models.wrapper import TextOfMultimodal
from hetero.engine.quant.config import QuantConfig

__all__ = [
    "DeepseekMoE",
    "DeepseekV2DecoderLayer",
    "DeepseekV3DecoderLayer",
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "Kimi_K25ForConditionalGeneration",
    "deepseek_routing",
    "mtp_ignore",
]


def deepseek_routing(hf_config: Any, v3: bool) -> Routing:
    """The ``route`` arguments of a DeepSeek MoE layer (see the module docstring)."""
    c = hf_config
    if v3:
        return Routing(
            top_k=c.num_experts_per_tok,
            scoring="sigmoid",
            renormalize=bool(c.norm_topk_prob),
            n_group=int(c.n_group or 1),
            topk_group=int(c.topk_group or 1),
            routed_scaling_factor=float(c.routed_scaling_factor),
        )
    method = getattr(c, "topk_method", "greedy")
    if method == "greedy":
        n_group, topk_group = 1, 1
    elif method == "group_limited_greedy":
        n_group, topk_group = int(c.n_group), int(c.topk_group)
    else:
        raise ValueError(f"DeepSeek-V2 topk_method {method!r} is not supported (greedy, group_limited_greedy)")
    return Routing(
        top_k=c.num_experts_per_tok,
        scoring="softmax",
        renormalize=bool(getattr(c, "norm_topk_prob", False)),
        n_group=n_group,
        topk_group=topk_group,
        routed_scaling_factor=float(c.routed_scaling_factor),
    )


def _mlp_bias(hf_config: Any, v3: bool) -> bool:
    """V2's ``mlp_bias`` (dense and shared-expert MLPs); V3 has none."""
    return bool(getattr(hf_config, "mlp_bias", False)) and not v3


class DeepseekMoE(nn.Module):
    """Router ``gate`` in float32, routed experts (``activation``: fused_moe's, ``limit`` its clamp), shared
    experts; returns their sum. ``num_experts``: the routed experts (None: the config's ``n_routed_experts``).

    V3's ``e_score_correction_bias`` is the FusedMoE's ``correction_bias`` Parameter,
    registered first under ``gate.e_score_correction_bias`` (the checkpoint's name) so
    the loader fills it directly.
    """

    def __init__(
        self,
        ctx: ModelContext,
        hf_config: Any,
        *,
        v3: bool,
        activation: str = "silu",
        limit: float | None = None,
        num_experts: int | None = None,
        prefix: str = "",
        quant_config: QuantConfig | None = None,
    ):
        super().__init__()
        c, self.prefix = hf_config, prefix
        experts = c.n_routed_experts if num_experts is None else num_experts
        self.gate = ReplicatedLinear(
            dataclasses.replace(ctx, dtype=torch.float32),
            c.hidden_size,
            experts,
            prefix=join_prefix(prefix, "gate"),
            quant_config=quant_config,
        )
        self.experts = FusedMoE(
            ctx,
            experts,
            c.hidden_size,
            c.moe_intermediate_size,
            deepseek_routing(c, v3),
            correction_bias=v3,
            activation=activation,
            limit=limit,
            prefix=join_prefix(prefix, "experts"),
            quant_config=quant_config,
        )
        if v3:
            self.gate.e_score_correction_bias = self.experts.correction_bias
        self.shared_experts = None
        if getattr(c, "n_shared_experts", None):  # MiMo-V2-Flash's config has no such field: no shared experts
            self.shared_experts = GatedMLP(
                ctx,
                c.hidden_size,
                c.moe_intermediate_size * c.n_shared_experts,
                bias=_mlp_bias(c, v3),
                prefix=join_prefix(prefix, "shared_experts"),
                quant_config=quant_config,
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.gate(x.float())
        out = self.experts(x, logits)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out


class DeepseekV2DecoderLayer(DecoderLayer):
    """MLA, then a dense MLP in layers ``[0, first_k_dense_replace)`` and the MoE block after."""

    v3 = False
    attention_cls = MLAttention
    moe_cls = partial(DeepseekMoE, v3=False)

    @staticmethod
    def is_moe_layer(config: Any, layer_idx: int) -> bool:
        return layer_idx >= config.first_k_dense_replace

    @classmethod
    def mlp_bias(cls, config: Any) -> bool:  # type: ignore[override]
        return _mlp_bias(config, cls.v3)

    @classmethod
    def rotary_table(cls, ctx: ModelContext, config: Any) -> RotaryEmbedding:
        """Rope on MLA's ``qk_rope_head_dim`` dims: interleaved pairs for V2, and for V3 when ``rope_interleave``."""
        interleaved = bool(getattr(config, "rope_interleave", True)) if cls.v3 else True
        return RotaryEmbedding(
            ctx, config, config.qk_rope_head_dim, config.max_position_embeddings, is_neox=not interleaved
        )


class DeepseekV3DecoderLayer(DeepseekV2DecoderLayer):
    v3 = True
    moe_cls = partial(DeepseekMoE, v3=True)


def mtp_ignore(hf_config: Any) -> tuple[str, ...]:
    """The checkpoint's multi-token-prediction layers: every layer index past ``num_hidden_layers``."""
    n = hf_config.num_hidden_layers
    extra = int(getattr(hf_config, "num_nextn_predict_layers", None) or getattr(hf_config, "num_mtp_layers", 0) or 0)
    return tuple(rf"model\.layers\.{i}\..*" for i in range(n, n + extra))


class DeepseekV2ForCausalLM(DecoderForCausalLM):
    """DeepSeek-V2 (and V2-Lite); the class ``mapping`` has no MTP layers, an instance's has its config's."""

    layer_cls = DeepseekV2DecoderLayer
    mapping = WeightMapping(packed=GATE_UP_PACKED, experts=WeightMapping.stacked_experts(), ignore=IGNORE)

    def weight_mapping(self, hf_config: Any) -> WeightMapping:
        """Packed gate/up, stacked experts, and the MTP layers past num_hidden_layers ignored."""
        return dataclasses.replace(type(self).mapping, ignore=IGNORE + mtp_ignore(hf_config))


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    """DeepSeek-V3 and R1 (and V3-architecture checkpoints)."""

    layer_cls = DeepseekV3DecoderLayer

    def build_mtp(self, model_dir):
        """The checkpoint's next-n layer as a speculative draft sharing this model's embedding and head
        (``mtp.NextNDraft``)."""
        from hetero.engine.models.mtp import NextNDraft

        return NextNDraft(self).load(model_dir)


class Kimi_K25ForConditionalGeneration(TextOfMultimodal, DeepseekV3ForCausalLM):
    """Kimi-K2.5's release, text only (``wrapper.py``): DeepSeek-V3 (``text_config``, whose ``kimi_k2``
    model_type transformers reads as ``deepseek_v3``) under ``language_model.model.`` and
    ``language_model.lm_head.``; the vision tower (``vision_tower.``) and projector (``mm_projector.``)
    ignored. transformers 5.24's ``save_pretrained`` writes the text layers as ``language_model.model.blocks.``
    (its vision ``blocks`` -> ``layers`` rename reversed over every name) and the projector's norm as
    ``model.mm_projector.pre_norm``: both read too."""

    text_renames = (
        (r"^language_model\.model\.blocks\.", "model.layers."),
        (r"^language_model\.model\.", "model."),
        (r"^language_model\.lm_head\.", "lm_head."),
    )
    vision_ignore = (r"vision_tower\..*", r"mm_projector\..*", r"model\.mm_projector\..*")
