"""Qwen3.5 and Qwen3.5-MoE, text only: Qwen3-Next's hybrid layers with separate Gated DeltaNet projections.

The checkpoints keep ``in_proj_qkv`` (q|k|v of all heads), ``in_proj_z``, ``in_proj_b`` and
``in_proj_a`` apart (the "split" layout); they pack into the same ``in_proj`` as Qwen3-Next's.
Qwen3.5 has a dense MLP in every layer; Qwen3.5-MoE routed experts plus the gated shared
expert in every layer, its router always renormalizing the top-k weights. Qwen3.5's
interleaved M-RoPE reduces to partial NeoX rope for text, where the temporal, height and
width positions are all the token's position, so the text model uses that.
"""
from __future__ import annotations

from typing import Any

from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.models.base import WeightMapping
from hetero.engine.models.qwen2 import QWEN_IGNORE, QWEN_PACKED, Qwen2MLP
from hetero.engine.models.qwen3_next import (MTP_IGNORE, HybridSparseMoeBlock, Qwen3NextDecoderLayer, Qwen3NextForCausalLM,
                                             Qwen3NextModel)
from hetero.engine.quant.config import QuantConfig

__all__ = ["Qwen3_5DecoderLayer", "Qwen3_5MoeDecoderLayer", "Qwen3_5Model", "Qwen3_5MoeModel", "Qwen3_5ForCausalLM",
           "Qwen3_5MoeForCausalLM"]

_SPLIT_PACKED = (("in_proj_qkv", "in_proj", "qkv"), ("in_proj_z", "in_proj", "z"), ("in_proj_b", "in_proj", "b"),
                 ("in_proj_a", "in_proj", "a"))


class Qwen3_5DecoderLayer(Qwen3NextDecoderLayer):
    """A hybrid layer with the split projections and a dense MLP of ``intermediate_size``."""

    layout = "split"

    def make_mlp(self, ctx: ModelContext, config: Any, layer_idx: int, *, prefix: str = "",
                 quant_config: QuantConfig | None = None) -> nn.Module:
        return Qwen2MLP(ctx, config.hidden_size, config.intermediate_size, prefix=prefix, quant_config=quant_config)


class Qwen3_5MoeDecoderLayer(Qwen3NextDecoderLayer):
    """A hybrid layer with the split projections and routed experts plus the gated shared expert."""

    layout = "split"

    def make_mlp(self, ctx: ModelContext, config: Any, layer_idx: int, *, prefix: str = "",
                 quant_config: QuantConfig | None = None) -> nn.Module:
        # transformers' Qwen3.5-MoE router renormalizes unconditionally (its config has no norm_topk_prob)
        return HybridSparseMoeBlock(ctx, config, renormalize=True, prefix=prefix, quant_config=quant_config)


class Qwen3_5Model(Qwen3NextModel):
    layer_cls = Qwen3_5DecoderLayer


class Qwen3_5MoeModel(Qwen3NextModel):
    layer_cls = Qwen3_5MoeDecoderLayer


class Qwen3_5ForCausalLM(Qwen3NextForCausalLM):
    """Qwen3.5 dense, text only (``Qwen3_5ForCausalLM`` / ``Qwen3_5TextConfig``)."""

    model_cls = Qwen3_5Model
    mapping = WeightMapping(packed=QWEN_PACKED + _SPLIT_PACKED, ignore=QWEN_IGNORE + MTP_IGNORE)


class Qwen3_5MoeForCausalLM(Qwen3NextForCausalLM):
    """Qwen3.5-MoE, text only (``Qwen3_5MoeForCausalLM`` / ``Qwen3_5MoeTextConfig``), per-expert checkpoint tensors."""

    model_cls = Qwen3_5MoeModel
    mapping = WeightMapping(packed=QWEN_PACKED + _SPLIT_PACKED, experts=WeightMapping.stacked_experts(),
                            ignore=QWEN_IGNORE + MTP_IGNORE)
