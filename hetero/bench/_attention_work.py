"""The byte and flop model of the attention family (see ``hetero.bench.model`` for the conventions)."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from hetero.bench._work import Work, attention_pairs, cache_write, lens, meta_bytes, nbytes

__all__ = ["ATTENTION_MODELS"]


def _paged_attention(a: Mapping[str, Any]) -> Work:
    q, k, v, meta = a["query"], a["k_cache"], a["v_cache"], a["meta"]
    t, hq, d = q.shape
    hkv, dv = k.shape[2], v.shape[3]
    pairs, union = attention_pairs(lens(meta.query_start_loc), meta.seq_lens.tolist(), a["causal"], a["window"])
    kv = union * hkv * (d * k.element_size() + dv * v.element_size())
    out = t * hq * dv * q.element_size() + (t * hq * 4 if a["return_lse"] else 0)
    return Work(2.0 * pairs * hq * (d + dv), nbytes(q) + kv + out + meta_bytes(meta) + nbytes(a["sinks"]))


def _varlen_attention(a: Mapping[str, Any]) -> Work:
    q, k, v = a["query"], a["key"], a["value"]
    t, hq, d = q.shape
    hkv, dv = k.shape[1], v.shape[2]
    pairs, union = attention_pairs(lens(a["cu_seqlens_q"]), lens(a["cu_seqlens_k"]), a["causal"], a["window"])
    kv = union * hkv * (d * k.element_size() + dv * v.element_size())
    out = t * hq * dv * q.element_size() + (t * hq * 4 if a["return_lse"] else 0)
    return Work(
        2.0 * pairs * hq * (d + dv), nbytes(q) + kv + out + nbytes(a["cu_seqlens_q"]) + nbytes(a["cu_seqlens_k"])
    )


def _mla_attention(a: Mapping[str, Any]) -> Work:
    q_nope, q_pe, ckv, kpe, meta = a["q_nope"], a["q_pe"], a["ckv_cache"], a["kpe_cache"], a["meta"]
    t, h, lkv = q_nope.shape
    r = q_pe.shape[2]
    if a["topk_indices"] is None:
        pairs, union = attention_pairs(lens(meta.query_start_loc), meta.seq_lens.tolist(), a["causal"])
    else:  # sparse: each row reads its own listed keys
        pairs = union = _sparse_pairs(meta, a["topk_indices"], a["causal"])
    kv = union * (lkv * ckv.element_size() + r * kpe.element_size())  # the latent is both key and value
    out = t * h * lkv * q_nope.element_size() + (t * h * 4 if a["return_lse"] else 0)
    return Work(
        2.0 * pairs * h * (2 * lkv + r),
        nbytes(q_nope) + nbytes(q_pe) + kv + out + meta_bytes(meta) + nbytes(a["topk_indices"]),
    )


def _merge_attention(a: Mapping[str, Any]) -> Work:
    out_a = a["out_a"]
    written = nbytes(out_a) + nbytes(a["lse_a"])
    return Work(
        3.0 * out_a.numel(), nbytes(out_a) + nbytes(a["out_b"]) + nbytes(a["lse_a"]) + nbytes(a["lse_b"]) + written
    )


def _sparse_pairs(meta: Any, indices: torch.Tensor, causal: bool) -> int:
    """The (row, key) pairs of sparse MLA: the entries of each row it can see, [0, pos] when causal,
    else [0, seq_len) (the rest are skipped)."""
    pairs, qsl = 0, meta.query_start_loc.tolist()
    for b, length in enumerate(meta.seq_lens.tolist()):
        n = qsl[b + 1] - qsl[b]
        pos = torch.arange(n)[:, None] + (length - n) if causal else torch.full((n, 1), length - 1)
        rows = indices[qsl[b] : qsl[b + 1]].to("cpu", torch.int64)
        pairs += int(((rows >= 0) & (rows <= pos)).sum())
    return pairs


def _write_index_k(a: Mapping[str, Any]) -> Work:
    """Plain: a cache write. fp8: read each valid row, write a byte per channel and a float32 per 128,
    three flops per value (abs-max, divide, clamp)."""
    k, slots, scale = a["k"], a["slot_mapping"], a["index_scale"]
    if scale is None:
        return cache_write(slots, k)
    valid, d = int((slots >= 0).sum()), k.shape[1]
    return Work(3.0 * valid * d, valid * d * (k.element_size() + 1) + valid * (d // 128) * 4 + nbytes(slots))


def _indexer_topk(a: Mapping[str, Any]) -> Work:
    """2 * D + 2 flops per (row, key, head) pair (dot, ReLU, weight); the keys some row sees (with their
    scales in the fp8 format), q, the weights and the int32 result."""
    q, cache, scale, meta = a["q"], a["index_cache"], a["index_scale"], a["meta"]
    t, hi, d = q.shape
    pairs, union = attention_pairs(lens(meta.query_start_loc), meta.seq_lens.tolist(), True)
    if a["compress_ratio"] != 1:  # spec 1.8: a row at pos sees (pos + 1) // m entries of its sequence's L // m
        pairs, union = _compressed_pairs(lens(meta.query_start_loc), meta.seq_lens.tolist(), a["compress_ratio"])
    keys = union * d * cache.element_size() + (union * (d // 128) * 4 if scale is not None else 0)
    return Work(
        pairs * hi * (2.0 * d + 2), nbytes(q) + nbytes(a["weights"]) + keys + t * a["topk"] * 4 + meta_bytes(meta)
    )


def _compressed_pairs(q_lens: list[int], kv_lens: list[int], m: int) -> tuple[int, int]:
    """(visible (row, entry) pairs, entries read) of indexer_topk over a compressed cache."""
    pairs = sum(sum((length - n + i + 1) // m for i in range(n)) for n, length in zip(q_lens, kv_lens))
    return pairs, sum(length // m for n, length in zip(q_lens, kv_lens) if n)


ATTENTION_MODELS = {
    "write_kv": lambda a: cache_write(a["slot_mapping"], a["key"], a["value"]),
    "paged_attention": _paged_attention,
    "varlen_attention": _varlen_attention,
    "write_mla_kv": lambda a: cache_write(a["slot_mapping"], a["kv_c"], a["k_pe"]),
    "mla_attention": _mla_attention,
    "merge_attention": _merge_attention,
    "write_index_k": _write_index_k,
    "indexer_topk": _indexer_topk,
}
