"""Inputs of the DSA cases: the index-key write, the indexer and sparse MLA."""

from __future__ import annotations

from typing import Any

import torch

from hetero.verify.inputs.draw import randn
from hetero.verify.inputs.dsa_draw import (
    DSA,
    Dsa,
    fp8_edge_keys,
    fp8_exact_keys,
    fp8_format,
    grid,
    index_weights,
    key_pool,
    sparse_rows,
)
from hetero.verify.inputs.paged import Seqs, blocks, meta, slots

__all__ = ["GLM5", "GLM5_TP8", "V32", "V32_TP8", "V4", "indexer", "sparse", "write"]

V32, GLM5, V4 = DSA["deepseek-v3.2"], DSA["glm-5"], DSA["deepseek-v4"]
V32_TP8, GLM5_TP8 = V32.shard(8), GLM5.shard(8)


def write(m: Dsa, bs: int, seqs: Seqs, skipped: int, *, fp8: bool = False, edges: bool = False, view: bool = False):
    """write_index_k. ``edges``: k at the fp8 format's edges; ``view``: k a slice of a wider projection."""

    def build(gen: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        nb, slot_mapping = slots(gen, seqs, bs, skipped)
        t = slot_mapping.shape[0]
        if edges:
            k = fp8_edge_keys(gen, t, m.d, dtype)
        else:
            k = randn(gen, (t, m.d + (64 if view else 0)), dtype)[:, : m.d]
        args: dict[str, Any] = {"k": k, "slot_mapping": slot_mapping}
        if fp8:
            q8, scale = fp8_format(randn(gen, (nb, bs, m.d), torch.float32))  # other tokens' keys
            args.update(index_cache=q8, index_scale=scale)
        else:
            args["index_cache"] = randn(gen, (nb, bs, m.d), dtype)
        return args

    return build


def indexer(
    m: Dsa,
    bs: int,
    seqs: Seqs,
    *,
    topk: int | None = None,
    fp8: bool = False,
    signed: bool = False,
    pool: int = 0,
    ratio: int = 1,
):
    """indexer_topk on grid values. ``pool``: keys drawn from that many vectors (exact ties); ``ratio`` m > 1
    (spec 1.8): the cache holds ``L // m`` compressed entries per sequence, paged by their own block table."""

    def build(gen: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        nb, table = blocks(gen, [L // ratio for _, L in seqs], bs)
        t = sum(n for n, _ in seqs)
        args: dict[str, Any] = {"q": grid(gen, (t, m.hi, m.d), dtype)}
        if fp8:
            q8, scale = fp8_format(fp8_exact_keys(gen, (nb, bs, m.d)))
            args.update(index_cache=q8, index_scale=scale)
        elif pool:
            args["index_cache"] = key_pool(gen, (nb, bs, m.d), pool, dtype)
        else:
            args["index_cache"] = grid(gen, (nb, bs, m.d), dtype)
        return {
            **args,
            "weights": index_weights(gen, t, m.hi, signed),
            "meta": meta(seqs, table),
            "topk": topk or m.topk,
            **({"compress_ratio": ratio} if ratio != 1 else {}),
        }

    return build


def sparse(m: Dsa, bs: int, seqs: Seqs, k: int, *, beyond: int = 0, empty: int = 0, idx64: bool = False):
    """Sparse mla_attention over top-k rows as indexer_topk returns them (see ``sparse_rows``)."""

    def build(gen: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        nb, table = blocks(gen, [L for _, L in seqs], bs)
        t = sum(n for n, _ in seqs)
        rows = sparse_rows(gen, seqs, k, beyond=beyond, empty=empty, dtype=torch.int64 if idx64 else torch.int32)
        return {
            "q_nope": randn(gen, (t, m.heads, m.lkv), dtype),
            "q_pe": randn(gen, (t, m.heads, m.rope), dtype),
            "ckv_cache": randn(gen, (nb, bs, m.lkv), dtype),
            "kpe_cache": randn(gen, (nb, bs, m.rope), dtype),
            "meta": meta(seqs, table),
            "scale": m.scale,
            "causal": True,
            "return_lse": True,
            "topk_indices": rows,
        }

    return build
