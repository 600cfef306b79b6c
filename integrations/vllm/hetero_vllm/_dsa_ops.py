"""DeepSeek sparse attention (DSA) as opaque ``torch.ops.hetero.dsa_*`` ops (see ``torch_ops`` for the pattern).

(The sparse attention itself is ``_mla_ops``'s ``mla_attention`` with ``topk_indices``.)

- ``dsa_indexer``: hetero ``write_index_k`` of the step's indexer keys into the indexer's own cache, then
  ``indexer_topk`` into vLLM's shared top-k buffer. The cache and the step's metadata are the ones vLLM bound
  to the indexer cache layer ``layer_name`` (read from the forward context, as vLLM's own indexer op does).

The top-k entries are sequence positions (hetero's contract at both ends), not cache slots.

Ordering under torch.compile: vLLM's attention op reads the top-k buffer at runtime from the impl, not as
an argument, so the graph has no edge from ``dsa_indexer`` to it and Inductor may schedule the indexer after
the attention (it does: the attention then reads the previous layer's top-k). ``dsa_indexer`` therefore
declares a mutation of ``fence``, a tensor the layer's attention depends on in the graph (see
``dsa.HeteroSparseMLAImpl.process_weights_after_loading``); it never writes it. ``topk_fresh`` lets the
attention check at runtime that its indexer did run first in this step.
"""

from __future__ import annotations

import torch

from hetero_vllm import _backend, report

__all__ = ["dsa_indexer", "meta_of", "topk_fresh"]

#: indexer cache layer name -> the forward context of the step in which its ``dsa_indexer`` last ran
_topk_step: dict[str, object] = {}


def meta_of(query_start_loc, seq_lens, block_table, max_query_len: int, max_seq_len: int):
    """A ``hetero.AttentionMeta`` of the step's batch layout."""
    from hetero import AttentionMeta

    return AttentionMeta(query_start_loc, seq_lens, block_table, int(max_query_len), int(max_seq_len))


def topk_fresh(layer_name: str) -> bool:
    """Whether ``dsa_indexer`` of the indexer cache layer ``layer_name`` ran in the current forward step."""
    from vllm.forward_context import get_forward_context

    return _topk_step.get(layer_name) is get_forward_context()


@torch.library.custom_op("hetero::dsa_indexer", mutates_args=("topk_indices", "fence"))
def dsa_indexer(
    q: torch.Tensor,
    k: torch.Tensor,
    weights: torch.Tensor,
    topk_indices: torch.Tensor,
    fence: torch.Tensor | None,
    layer_name: str,
    site: str,
) -> None:
    """hetero ``write_index_k`` + ``indexer_topk`` for the indexer cache layer ``layer_name``.

    q [T, Hi, D] and k [T, D] post-rope; weights [T, Hi] with every scale folded in; topk_indices int32
    [>= T, K] (vLLM's shared buffer): rows [:T] receive the step's top-k positions (-1 padded). ``fence``
    is declared mutated and left untouched: it orders this op before the attention that reads the rows (see
    the module docstring). Outside a step (vLLM's profiling run has no metadata) it writes nothing.
    """
    from vllm.forward_context import get_forward_context

    context = get_forward_context()
    _topk_step[layer_name] = context
    metadata = context.attn_metadata
    if isinstance(metadata, list):  # speculative decoding: [0] is the base model's
        metadata = metadata[0]
    meta = metadata.get(layer_name) if isinstance(metadata, dict) else None
    if meta is None:
        return
    cache = context.no_compile_layers[layer_name].kv_cache
    n = meta.num_actual_tokens
    ops = _backend.ops()
    report.record(site, "write_index_k")
    ops.write_index_k(k[:n], cache, meta.slot_mapping[:n])
    report.record(site, "indexer_topk")
    hmeta = meta_of(meta.query_start_loc, meta.seq_lens, meta.block_table, meta.max_query_len, meta.max_seq_len)
    top = ops.indexer_topk(q[:n], weights[:n], cache, hmeta, topk=topk_indices.shape[1])
    topk_indices[:n].copy_(top)


@dsa_indexer.register_fake
def _(q, k, weights, topk_indices, fence, layer_name, site):
    return None
