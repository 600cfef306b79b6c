"""gpt-oss (``GptOssForCausalLM``): GQA attention with sinks, alternating sliding/full layers, MoE in every layer.

Mirrors transformers 5.24's modeling_gpt_oss.py:

- attention: q/k/v/o biases (``attention_bias``), NeoX rope (yarn by default: its attention factor scales
  cos/sin), ``head_dim ** -0.5``, per-head ``sinks`` (an extra softmax logit, float32, split over the ranks
  with the heads), ``layer_types`` "sliding_attention" (``sliding_window`` keys, the token's own included:
  ``window = (W - 1, -1)``) or "full_attention";
- MLP: router ``logits = x @ W.T + b`` (the model dtype), top-``num_experts_per_tok`` then softmax over them
  (``route(scoring="softmax", renormalize=True)``), experts with ``swigluoai`` (``swiglu_alpha``,
  ``swiglu_limit``) and biases (``layers/moe_oai.py``), no shared expert;
- RMSNorms with ``rms_norm_eps``, untied LM head.

Expert weights: bf16/float32 (``gate_up_proj`` ...) or MXFP4 (``*_blocks`` / ``*_scales`` with
``quantization_config.quant_method == "mxfp4"``), dequantized at load. Any other quantization is refused
(``UnsupportedQuantization``). Tensor parallel only (no expert parallelism).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.gqa import GQAttention
from hetero.engine.layers.linear import ReplicatedLinear
from hetero.engine.layers.moe_oai import OaiExperts
from hetero.engine.layers.rotary import RotaryEmbedding
from hetero.engine.layers.weights import head_param, join_prefix
from hetero.engine.models.decoder import DecoderForCausalLM, DecoderLayer
from hetero.engine.quant.config import QuantConfig, quant_config_of

__all__ = ["GptOssAttention", "GptOssMLP", "GptOssDecoderLayer", "GptOssForCausalLM", "is_mxfp4"]


def is_mxfp4(hf_config: Any) -> bool:
    """Whether the checkpoint's experts are MXFP4 (``quantization_config.quant_method == "mxfp4"``)."""
    qc = getattr(hf_config, "quantization_config", None)
    if not qc:
        return False
    if not isinstance(qc, Mapping):
        qc = qc.to_dict() if hasattr(qc, "to_dict") else vars(qc)
    return qc.get("quant_method") == "mxfp4"


class GptOssAttention(GQAttention):
    """GQA attention with biases on q/k/v and o (unless ``attention_bias`` is false), and this rank's sink
    logits (``sinks`` float32 [Hq/R])."""

    with_sinks = True

    def __init__(
        self,
        ctx: ModelContext,
        config: Any,
        layer_idx: int,
        rotary: RotaryEmbedding,
        *,
        prefix: str = "",
        quant_config: QuantConfig | None = None,
    ):
        super().__init__(ctx, config, layer_idx, rotary, prefix=prefix, quant_config=quant_config)
        self.sinks = head_param(self.num_heads, ctx.parallel.rank, ctx.parallel.size, ctx.device, "sinks")

    @staticmethod
    def biases(config: Any) -> tuple[bool, bool]:
        bias = bool(getattr(config, "attention_bias", True))
        return bias, bias


class GptOssMLP(nn.Module):
    """``experts(x, router(x))``: a biased router, then the swigluoai experts."""

    def __init__(self, ctx: ModelContext, config: Any, *, prefix: str = "", quant_config: QuantConfig | None = None):
        super().__init__()
        c, self.prefix = config, prefix
        self.router = ReplicatedLinear(
            ctx,
            c.hidden_size,
            c.num_local_experts,
            bias=True,
            prefix=join_prefix(prefix, "router"),
            quant_config=quant_config,
        )
        self.experts = OaiExperts(
            ctx,
            c.num_local_experts,
            c.hidden_size,
            c.intermediate_size,
            c.num_experts_per_tok,
            alpha=c.swiglu_alpha,
            limit=c.swiglu_limit,
            mxfp4=is_mxfp4(c),
            prefix=join_prefix(prefix, "experts"),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.experts(x, self.router(x))


class GptOssDecoderLayer(DecoderLayer):
    attention_cls = GptOssAttention
    moe_cls = GptOssMLP


class GptOssForCausalLM(DecoderForCausalLM):
    """gpt-oss-20b / 120b (bf16, or MXFP4 experts dequantized at load) and their tiny versions."""

    layer_cls = GptOssDecoderLayer

    def __init__(self, hf_config: Any, ctx: ModelContext, *, quant_config: QuantConfig | None = None):
        if quant_config is None:  # MXFP4 touches the experts only, which handle it themselves
            quant_config = QuantConfig() if is_mxfp4(hf_config) else quant_config_of(hf_config)
        super().__init__(hf_config, ctx, quant_config=quant_config)
