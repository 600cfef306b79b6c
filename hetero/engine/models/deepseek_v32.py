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

The layers share one ``SharedIndices`` (``layers/dsa.py``): each full layer writes its indices there, a
shared layer reads them.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from hetero.engine.context import ModelContext
from hetero.engine.layers.dsa import INDEXER_TYPES, SharedIndices, SparseMLAttention, indexer_types_of
from hetero.engine.models.deepseek import DeepseekV3DecoderLayer, DeepseekV3ForCausalLM
from hetero.engine.quant.config import QuantConfig

__all__ = [
    "DsaDecoderLayer",
    "GlmMoeDsaDecoderLayer",
    "DeepseekV32ForCausalLM",
    "GlmMoeDsaForCausalLM",
    "indexer_types_of",
    "INDEXER_TYPES",
]


def _is_moe_layer(hf_config: Any, layer: int) -> bool:
    types = getattr(hf_config, "mlp_layer_types", None)
    if types is not None:
        return types[layer] == "sparse"
    return layer >= hf_config.first_k_dense_replace


class DsaDecoderLayer(DeepseekV3DecoderLayer):
    """DeepSeek-V3's layer with sparse MLA (NeoX indexer rope) and the ``mlp_layer_types`` schedule."""

    attention_cls = SparseMLAttention
    is_moe_layer = staticmethod(_is_moe_layer)


class GlmMoeDsaDecoderLayer(DsaDecoderLayer):
    """GLM-5's: the indexer's rope pairs interleaved."""

    attention_cls = partial(SparseMLAttention, indexer_interleaved=True)


class DeepseekV32ForCausalLM(DeepseekV3ForCausalLM):
    """DeepSeek-V3.2(-Exp): every layer runs its own indexer (NeoX rope)."""

    layer_cls = DsaDecoderLayer

    def __init__(self, hf_config: Any, ctx: ModelContext, *, quant_config: QuantConfig | None = None):
        super().__init__(hf_config, ctx, quant_config=quant_config)
        # one per model: a shared layer reads what the full layer before it wrote
        self.model.share_indices(SharedIndices(), indexer_types_of(hf_config))


class GlmMoeDsaForCausalLM(DeepseekV32ForCausalLM):
    """GLM-5: interleaved indexer rope, "shared" layers by ``indexer_types``."""

    layer_cls = GlmMoeDsaDecoderLayer
