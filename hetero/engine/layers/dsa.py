"""DeepSeek Sparse Attention (DSA): MLA restricted to the keys a lightning indexer selects per query row.

Every row (decode, prefill, chunked prefill alike) takes the absorbed path: ``mla_attention`` over the paged
latent cache with ``topk_indices`` from this layer's ``Indexer``, or, for a GLM-5 "shared" layer
(``indexer_types[i] == "shared"``), the indices the previous "full" layer computed in the same step; a shared
layer has no indexer and no index-key cache. The cache entries are MLA's two latent entries plus the
indexer's ``index_cache``, all paged over the same block ids.
"""
from __future__ import annotations

from typing import Any

import torch

from hetero.engine.context import ModelContext
from hetero.engine.layers.indexer import Indexer
from hetero.engine.layers.mla import MLAttention
from hetero.engine.layers.rotary import RotaryEmbedding
from hetero.engine.layers.weights import join_prefix
from hetero.engine.quant.config import QuantConfig
from hetero.engine.step import Step

__all__ = ["SparseMLAttention"]


class SparseMLAttention(MLAttention):
    """``forward(hidden [T, H], step, topk=None) -> (out [T, H], topk int32 [T, index_topk])``.

    ``has_indexer`` False: a shared layer, which needs ``topk`` from an earlier layer of the step.
    ``indexer_rotary`` is a twin of the model's rotary table for the indexer, NeoX pairs unless
    ``indexer_interleaved``.
    """

    # topk_indices is a 1.3 option: an implementation without it declines and the reference serves it
    mla_options = {"topk_indices": True}
    expanded_prefill = False

    def __init__(self, ctx: ModelContext, hf_config: Any, rotary: RotaryEmbedding, indexer_rotary: RotaryEmbedding,
                 *, has_indexer: bool = True, indexer_interleaved: bool = False, prefix: str = "",
                 quant_config: QuantConfig | None = None):
        super().__init__(ctx, hf_config, rotary, prefix=prefix, quant_config=quant_config)
        if self.q_lora_rank is None:
            raise ValueError("sparse MLA (DSA) needs q_lora_rank: the indexer reads q_a_layernorm's output")
        self.indexer = None
        if has_indexer:
            self.indexer = Indexer(ctx, hf_config, indexer_rotary, interleaved=indexer_interleaved,
                                   prefix=join_prefix(prefix, "indexer"), quant_config=quant_config)

    def forward(self, hidden: torch.Tensor, step: Step, topk: torch.Tensor | None = None):  # type: ignore[override]
        t = hidden.shape[0]
        q_nope, q_pe, q_resid = self.project(hidden, step)
        if self.indexer is not None:
            topk = self.indexer(hidden, q_resid, step)
        elif topk is None:
            raise RuntimeError(f"{self.prefix}: a shared DSA layer needs the indices of an earlier full layer")
        out = self.absorbed(q_nope, q_pe, step.meta, topk_indices=topk)
        return self.o_proj(out.reshape(t, self.num_heads * self.v_dim)), topk
