"""Qwen2: GQA attention with q/k/v bias (never o_proj's), gated SiLU MLP, RMSNorm, optional tied embeddings."""

from __future__ import annotations

from typing import Any

from hetero.engine.layers.gqa import GQAttention
from hetero.engine.models.decoder import DecoderForCausalLM, DecoderLayer

__all__ = ["Qwen2Attention", "Qwen2DecoderLayer", "Qwen2ForCausalLM"]


class Qwen2Attention(GQAttention):
    @staticmethod
    def biases(config: Any) -> tuple[bool, bool]:
        """Qwen2 always has the q/k/v bias and never the o_proj one."""
        return True, False


class Qwen2DecoderLayer(DecoderLayer):
    attention_cls = Qwen2Attention


class Qwen2ForCausalLM(DecoderForCausalLM):
    """Qwen2: ``model.*`` plus ``lm_head`` (tied when configured)."""

    layer_cls = Qwen2DecoderLayer
