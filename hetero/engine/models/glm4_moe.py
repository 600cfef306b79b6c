"""GLM-4.5 / 4.6 / 4.7 (``glm4_moe``, Zhipu): GQA whose q/k/v have a bias when ``attention_bias`` (o_proj never
does), per-head q/k RMSNorms before rope when ``use_qk_norm``, NeoX rope on the first ``partial_rotary_factor``
of each head (0.5 in every release).

Layers ``[0, first_k_dense_replace)`` have a dense MLP, the rest DeepSeek-V3's MoE block (``deepseek.DeepseekMoE``,
the same tensor names): a float32 router ``gate``, sigmoid scores whose ``e_score_correction_bias`` only
selects, top-2-sum groups (``n_group`` / ``topk_group``), renormalized when ``norm_topk_prob``, times
``routed_scaling_factor``, plus ``n_shared_experts`` shared experts. The checkpoint's MTP layers (indices
``[num_hidden_layers, num_hidden_layers + num_nextn_predict_layers)``) are ignored by name; ``build_mtp`` runs the
first as a speculative draft (``mtp.py``).
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.gated_attention import rotary_dim_of
from hetero.engine.layers.gqa import GQAttention, head_dim_of
from hetero.engine.layers.rotary import RotaryEmbedding
from hetero.engine.models.base import WeightMapping
from hetero.engine.models.decoder import GATE_UP_PACKED, IGNORE, QKV_PACKED, DecoderForCausalLM, DecoderLayer
from hetero.engine.models.deepseek import DeepseekMoE, mtp_ignore
from hetero.engine.models.qwen3 import Qwen3Attention
from hetero.engine.quant.config import QuantConfig
from hetero.errors import UsageError

__all__ = [
    "Glm4MoeAttention",
    "Glm4MoeQKNormAttention",
    "Glm4MoeDecoderLayer",
    "Glm4MoeForCausalLM",
    "check_config",
    "glm4_moe_attention",
    "is_moe_layer",
]


def check_config(config: Any) -> None:
    """Refuse, by field name, a GLM-4.5 config asking for what hetero does not compute: an activation other
    than SiLU, or no shared expert (transformers' class always builds one, ``n_shared_experts`` wide)."""
    if config.hidden_act != "silu":
        raise UsageError(
            f"GLM-4.5: hidden_act={config.hidden_act!r} is not implemented",
            arg="hidden_act",
            expected="silu",
            got=config.hidden_act,
        )
    if int(config.n_shared_experts) < 1:
        raise UsageError(
            "GLM-4.5: n_shared_experts must be at least 1 (every release has one shared expert)",
            arg="n_shared_experts",
            expected=">= 1",
            got=config.n_shared_experts,
        )


def is_moe_layer(config: Any, layer_idx: int) -> bool:
    """Routed experts from layer ``first_k_dense_replace`` on; a dense MLP of ``intermediate_size`` before."""
    return layer_idx >= config.first_k_dense_replace


def _biases(config: Any) -> tuple[bool, bool]:
    return bool(config.attention_bias), False


class Glm4MoeAttention(GQAttention):
    """GQA with q/k/v biased when ``attention_bias``, o_proj unbiased (``use_qk_norm`` false)."""

    biases = staticmethod(_biases)


class Glm4MoeQKNormAttention(Qwen3Attention):
    """The same with per-head ``q_norm`` / ``k_norm`` before rope (``use_qk_norm`` true)."""

    biases = staticmethod(_biases)


def glm4_moe_attention(
    ctx: ModelContext,
    config: Any,
    layer_idx: int,
    rotary: RotaryEmbedding,
    *,
    prefix: str,
    quant_config: QuantConfig | None,
) -> nn.Module:
    """The layer's attention: with q/k norms iff ``use_qk_norm``."""
    cls = Glm4MoeQKNormAttention if config.use_qk_norm else Glm4MoeAttention
    return cls(ctx, config, layer_idx, rotary, prefix=prefix, quant_config=quant_config)


class Glm4MoeDecoderLayer(DecoderLayer):
    attention_cls = staticmethod(glm4_moe_attention)
    moe_cls = partial(DeepseekMoE, v3=True)
    is_moe_layer = staticmethod(is_moe_layer)

    @classmethod
    def rotary_table(cls, ctx: ModelContext, config: Any) -> RotaryEmbedding:
        """NeoX pairs over the first ``partial_rotary_factor`` of each head."""
        dim = rotary_dim_of(config, head_dim_of(config))
        return RotaryEmbedding(ctx, config, dim, config.max_position_embeddings, is_neox=True)


class Glm4MoeForCausalLM(DecoderForCausalLM):
    """GLM-4.5, GLM-4.5-Air, GLM-4.6, GLM-4.7: per-expert checkpoint tensors (as released and as transformers
    writes them) or every expert fused; an instance's mapping also ignores its config's MTP layers."""

    layer_cls = Glm4MoeDecoderLayer
    mapping = WeightMapping(
        packed=QKV_PACKED + GATE_UP_PACKED,
        experts=WeightMapping.stacked_experts() + WeightMapping.fused_experts(),
        ignore=IGNORE,
    )

    def __init__(self, hf_config: Any, ctx: ModelContext, *, quant_config: QuantConfig | None = None):
        check_config(hf_config)
        super().__init__(hf_config, ctx, quant_config=quant_config)

    def weight_mapping(self, hf_config: Any) -> WeightMapping:
        return dataclasses.replace(type(self).mapping, ignore=IGNORE + mtp_ignore(hf_config))

    def build_mtp(self, model_dir):
        """The checkpoint's next-n layer as a speculative draft sharing this model's embedding and head
        (``mtp.NextNDraft``)."""
        from hetero.engine.models.mtp import NextNDraft

        return NextNDraft(self).load(model_dir)
