"""Qwen3.5 and Qwen3.5-MoE, text only: Qwen3-Next's hybrid layers with separate Gated DeltaNet projections.

The checkpoints keep ``in_proj_qkv`` (q|k|v of all heads), ``in_proj_z``, ``in_proj_b`` and
``in_proj_a`` apart (the "split" layout); they pack into the same ``in_proj`` as Qwen3-Next's.
Qwen3.5 has a dense MLP in every layer; Qwen3.5-MoE routed experts plus the gated shared
expert in every layer, its router always renormalizing the top-k weights. Qwen3.5's
interleaved M-RoPE reduces to partial NeoX rope for text, where the temporal, height and
width positions are all the token's position, so the text model uses that.

The releases are the multimodal wrappers (``Qwen3_5ForConditionalGeneration``,
``Qwen3_5MoeForConditionalGeneration``): the text model under ``model.language_model.``, the vision
tower and its merger under ``model.visual.``, ``lm_head`` and ``mtp.*`` at the top (``wrapper.py``).
"""

from __future__ import annotations

from functools import partial

from hetero.engine.models.base import WeightMapping
from hetero.engine.models.decoder import GATE_UP_PACKED, IGNORE, QKV_PACKED, DecoderForCausalLM, every_layer
from hetero.engine.models.qwen3_next import (
    MTP_IGNORE,
    HybridSparseMoeBlock,
    Qwen3NextDecoderLayer,
    Qwen3NextForCausalLM,
)
from hetero.engine.models.wrapper import TextOfMultimodal

__all__ = [
    "Qwen3_5DecoderLayer",
    "Qwen3_5MoeDecoderLayer",
    "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
]

_PACKED = (
    QKV_PACKED
    + GATE_UP_PACKED
    + (
        ("in_proj_qkv", "in_proj", "qkv"),
        ("in_proj_z", "in_proj", "z"),
        ("in_proj_b", "in_proj", "b"),
        ("in_proj_a", "in_proj", "a"),
    )
)


class Qwen3_5DecoderLayer(Qwen3NextDecoderLayer):
    """A hybrid layer with the split projections and a dense MLP of ``intermediate_size``."""

    layout = "split"
    moe_cls = None


class Qwen3_5MoeDecoderLayer(Qwen3NextDecoderLayer):
    """A hybrid layer with the split projections and routed experts plus the gated shared expert, every layer."""

    layout = "split"
    # transformers' Qwen3.5-MoE router renormalizes unconditionally (its config has no norm_topk_prob)
    moe_cls = partial(HybridSparseMoeBlock, renormalize=True)
    is_moe_layer = staticmethod(every_layer)


class Qwen3_5ForCausalLM(DecoderForCausalLM):
    """Qwen3.5 dense, text only (``Qwen3_5ForCausalLM`` / ``Qwen3_5TextConfig``)."""

    layer_cls = Qwen3_5DecoderLayer
    mapping = WeightMapping(packed=_PACKED, ignore=IGNORE + MTP_IGNORE)
    build_mtp = Qwen3NextForCausalLM.build_mtp


class Qwen3_5MoeForCausalLM(DecoderForCausalLM):
    """Qwen3.5-MoE, text only (``Qwen3_5MoeForCausalLM`` / ``Qwen3_5MoeTextConfig``): per-expert checkpoint tensors,
    or every expert fused (``experts.gate_up_proj [E, 2I, H]`` / ``experts.down_proj [E, H, I]``: the release)."""

    layer_cls = Qwen3_5MoeDecoderLayer
    mapping = WeightMapping(
        packed=_PACKED,
        experts=WeightMapping.stacked_experts() + WeightMapping.fused_experts(),
        ignore=IGNORE + MTP_IGNORE,
    )
    build_mtp = Qwen3NextForCausalLM.build_mtp


class Qwen3_5ForConditionalGeneration(TextOfMultimodal, Qwen3_5ForCausalLM):
    """Qwen3.5's release, text only: ``model.language_model.*`` read as ``model.*``, ``model.visual.*`` ignored."""

    text_renames = ((r"^model\.language_model\.", "model."),)
    vision_ignore = (r"model\.visual\..*",)


class Qwen3_5MoeForConditionalGeneration(TextOfMultimodal, Qwen3_5MoeForCausalLM):
    """Qwen3.5-MoE's release, text only (as ``Qwen3_5ForConditionalGeneration``)."""

    text_renames = Qwen3_5ForConditionalGeneration.text_renames
    vision_ignore = Qwen3_5ForConditionalGeneration.vision_ignore
