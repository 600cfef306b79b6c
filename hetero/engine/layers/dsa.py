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

__all__ = ["SparseMLAttention", "SharedIndices", "INDEXER_TYPES", "indexer_types_of"]

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


class SharedIndices:
    """The indices the last layer with an indexer selected, for the shared layers after it in the same forward.

    One per model: ``SparseMLAttention.shared`` of all its layers is the same object (the model links them).
    """

    __slots__ = ("topk",)

    def __init__(self):
        self.topk: torch.Tensor | None = None


class SparseMLAttention(MLAttention):
    """``forward(hidden [T, H], step) -> out [T, H]``; a decoder token mixer (``models/decoder.py``).

    Layer ``layer_idx`` has an indexer unless ``indexer_types_of(hf_config)`` says "shared"; a shared layer
    reads the indices an earlier layer of the step wrote to ``shared`` (a ``SharedIndices`` the model gives
    all its layers). The indexer rotates with a twin of ``rotary``, NeoX pairs unless ``indexer_interleaved``.
    """

    # topk_indices is a 1.3 option: an implementation without it declines and the reference serves it
    mla_options = {"topk_indices": True}
    expanded_prefill = False

    def __init__(
        self,
        ctx: ModelContext,
        hf_config: Any,
        layer_idx: int,
        rotary: RotaryEmbedding,
        *,
        indexer_interleaved: bool = False,
        prefix: str = "",
        quant_config: QuantConfig | None = None,
    ):
        super().__init__(ctx, hf_config, layer_idx, rotary, prefix=prefix, quant_config=quant_config)
        if self.q_lora_rank is None:
            raise ValueError("sparse MLA (DSA) needs q_lora_rank: the indexer reads q_a_layernorm's output")
        self.shared = SharedIndices()
        self.indexer = None
        if indexer_types_of(hf_config)[layer_idx] == "full":
            self.indexer = Indexer(
                ctx,
                hf_config,
                rotary.twin(ctx),
                interleaved=indexer_interleaved,
                prefix=join_prefix(prefix, "indexer"),
                quant_config=quant_config,
                **self.indexer_options(hf_config),
            )

    def indexer_options(self, hf_config: Any) -> dict[str, Any]:
        """Keyword options of this family's ``Indexer`` (HY4: which rope dims, a float32 k_norm)."""
        return {}

    def forward(self, hidden: torch.Tensor, step: Step) -> torch.Tensor:  # type: ignore[override]
        t = hidden.shape[0]
        return self.o_proj(self.attend(hidden, step).reshape(t, self.num_heads * self.v_dim))

    def attend(self, hidden: torch.Tensor, step: Step, **options) -> torch.Tensor:
        """Every row's sparse absorbed attention, [T, h, v_head_dim] before o_proj (``options``: more
        ``mla_attention`` arguments, e.g. ``sinks``)."""
        t = hidden.shape[0]
        q_nope, q_pe, q_resid = self.project(hidden, step)
        if self.indexer is not None:
            topk = self.shared.topk = self.indexer(hidden, q_resid, step)
        else:
            topk = self.shared.topk
            if topk is None or topk.shape[0] != t:
                raise RuntimeError(f"{self.prefix}: a shared DSA layer needs the indices of an earlier full layer")
        return self.absorbed(q_nope, q_pe, step.meta, topk_indices=topk, **options)
