"""DeepSeek-V3.2 and GLM-5 (``glm_moe_dsa``): DeepSeek-V3 with DeepSeek Sparse Attention (DSA) in every layer.

Mirrors transformers 5.24's modeling_deepseek_v32.py / modeling_glm_moe_dsa.py:

- attention: V3's MLA (q_lora_rank always, interleaved rope on MLA's q_pe / k_pe, softmax scale
  ``qk_head_dim ** -0.5`` times the yarn mscale squared) restricted per query row to the keys the layer's
  lightning indexer selects (``layers/indexer.py``, ``layers/dsa.py``); the indexer's rope is NeoX for
  V3.2 and interleaved for GLM-5;
- GLM-5 ``indexer_types``: a "shared" layer has no indexer and reuses the indices of the previous
  "full" layer of the same step (transformers' ``prev_topk_indices``); the first layer must be "full";
- MLP: ``mlp_layer_types[i]`` "dense" (a SwiGLU MLP) or "sparse" (V3's MoE: sigmoid router with
  correction bias and group limits, shared experts), by default the first ``first_k_dense_replace``
  dense;
- layers past ``num_hidden_layers`` (MTP) ignored, as for V3.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.dsa import SparseMLAttention
from hetero.engine.layers.norm import RMSNorm
from hetero.engine.layers.rotary import RotaryEmbedding
from hetero.engine.layers.weights import join_prefix
from hetero.engine.models.deepseek import DeepseekMLP, DeepseekMoE, _DeepseekForCausalLM
from hetero.engine.quant.config import QuantConfig
from hetero.engine.step import Step

__all__ = ["DsaDecoderLayer", "DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM", "indexer_types_of", "INDEXER_TYPES"]

#: what a layer's indexer does (GLM-5's ``indexer_types``): run, or reuse the previous full layer's indices
INDEXER_TYPES = ("full", "shared")


def indexer_types_of(hf_config: Any) -> list[str]:
    """Per layer "full" or "shared": the config's ``indexer_types`` (GLM-5), else every layer full (V3.2)."""
    n = hf_config.num_hidden_layers
    types = list(getattr(hf_config, "indexer_types", None) or ["full"] * n)
    if len(types) < n or any(t not in INDEXER_TYPES for t in types[:n]):
        raise ValueError(f"indexer_types must give one of {INDEXER_TYPES} for each of the {n} layers, got {types}")
    if n and types[0] != "full":
        raise ValueError("indexer_types[0] is 'shared': a shared layer reuses an earlier full layer's indices")
    return types[:n]


def _is_moe_layer(hf_config: Any, layer: int) -> bool:
    types = getattr(hf_config, "mlp_layer_types", None)
    if types is not None:
        return types[layer] == "sparse"
    return layer >= hf_config.first_k_dense_replace


class DsaDecoderLayer(nn.Module):
    """Pre-norm sparse MLA then the MLP; ``forward(x, step, topk) -> (x, topk)`` (the residual stream, the indices)."""

    def __init__(self, ctx: ModelContext, hf_config: Any, layer: int, rotary: RotaryEmbedding, *,
                 indexer_interleaved: bool, prefix: str = "", quant_config: QuantConfig | None = None):
        super().__init__()
        c, self.prefix = hf_config, prefix
        q = dict(quant_config=quant_config)
        self.self_attn = SparseMLAttention(ctx, c, rotary.twin(ctx), rotary.twin(ctx),
                                           has_indexer=indexer_types_of(c)[layer] == "full",
                                           indexer_interleaved=indexer_interleaved,
                                           prefix=join_prefix(prefix, "self_attn"), **q)
        if _is_moe_layer(c, layer):
            self.mlp = DeepseekMoE(ctx, c, True, prefix=join_prefix(prefix, "mlp"), **q)
        else:
            self.mlp = DeepseekMLP(ctx, c.hidden_size, c.intermediate_size, prefix=join_prefix(prefix, "mlp"), **q)
        self.input_layernorm = RMSNorm(ctx, c.hidden_size, c.rms_norm_eps,
                                       prefix=join_prefix(prefix, "input_layernorm"))
        self.post_attention_layernorm = RMSNorm(ctx, c.hidden_size, c.rms_norm_eps,
                                                prefix=join_prefix(prefix, "post_attention_layernorm"))

    def forward(self, x: torch.Tensor, step: Step, topk: torch.Tensor | None = None):
        attn, topk = self.self_attn(self.input_layernorm(x), step, topk)
        h, x = self.post_attention_layernorm(attn, residual=x)
        return x + self.mlp(h), topk


class _DsaForCausalLM(_DeepseekForCausalLM):
    v3 = True
    #: the indexer's rope pairs: NeoX for DeepSeek-V3.2, interleaved for GLM-5
    indexer_interleaved = False

    def make_layer(self, ctx: ModelContext, hf_config: Any, layer: int, rotary: RotaryEmbedding,
                   quant_config: QuantConfig) -> nn.Module:
        return DsaDecoderLayer(ctx, hf_config, layer, rotary, indexer_interleaved=self.indexer_interleaved,
                               prefix=f"model.layers.{layer}", quant_config=quant_config)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, step: Step,
                capture: list[torch.Tensor] | None = None) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)
        if capture is not None:
            capture.append(x)
        topk = None
        for layer in self.model.layers:
            x, topk = layer(x, step, topk)
            if capture is not None:
                capture.append(x)
        return self.model.norm(x)


class DeepseekV32ForCausalLM(_DsaForCausalLM):
    """DeepSeek-V3.2(-Exp): every layer runs its own indexer (NeoX rope)."""

    indexer_interleaved = False


class GlmMoeDsaForCausalLM(_DsaForCausalLM):
    """GLM-5: interleaved indexer rope, "shared" layers by ``indexer_types``."""

    indexer_interleaved = True
