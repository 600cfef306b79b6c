"""Malformed calls of the DSA ops (write_index_k, indexer_topk, sparse mla_attention) and layer_norm (spec 1.3)."""

from __future__ import annotations

import dataclasses

import torch

from hetero.spec import AttentionMeta
from hetero_conformance.cases._malformed import Draw, Malformed, altered, meta_field, put, swap

__all__ = ["calls"]

NB, BS, D, HI, TOPK = 6, 16, 128, 8, 32  # the indexer's key dim; heads and top-k shrunk
LKV, R, H = 512, 64, 4
FP8 = torch.float8_e4m3fn


def _meta(d: Draw) -> AttentionMeta:
    # a chunked prefill of 3 rows over 40 keys (3 blocks) and a decode row over 17 keys (2 blocks)
    table = d.perm(NB)[:6].reshape(2, 3)
    return AttentionMeta.build([3, 1], [40, 17], table, device=d.device)


def _write(d: Draw) -> dict:
    slots = d.perm(NB * BS)[:5].clone()
    slots[2] = -1  # a skipped token: legal
    return {"k": d.randn(5, D), "index_cache": d.randn(NB, BS, D), "slot_mapping": slots}


def _write_fp8(d: Draw) -> dict:
    args = _write(d)
    return {**args, "index_cache": args["index_cache"].to(FP8), "index_scale": d.uniform(1e-3, 1e-2, NB, BS, D // 128)}


def _indexer(d: Draw) -> dict:
    return {
        "q": d.randn(4, HI, D),
        "weights": d.uniform(0.1, 1.0, 4, HI),
        "index_cache": d.randn(NB, BS, D),
        "meta": _meta(d),
        "topk": TOPK,
    }


def _indexer_fp8(d: Draw) -> dict:
    return {
        **_indexer(d),
        "index_cache": d.randn(NB, BS, D, dtype=FP8),
        "index_scale": d.uniform(1e-3, 1e-2, NB, BS, 1),
    }


def _indexer_compressed(d: Draw) -> dict:
    """spec 1.8: 40 and 17 tokens pooled every 4 into 10 and 4 entries, one block each."""
    return {**_indexer(d), "compress_ratio": 4}


def _more_entries(meta: AttentionMeta) -> AttentionMeta:
    """seq_lens[0] whose 49 entries (196 tokens) need a fourth column of the 3-column table."""
    return dataclasses.replace(meta, seq_lens=altered(meta.seq_lens, 0, 196), max_seq_len=196)


def _sparse(d: Draw) -> dict:
    rows = torch.stack([d.perm(40)[:TOPK] for _ in range(4)]).to(torch.int32)  # distinct per row; past pos is skipped
    rows[1, 5] = -1
    return {
        "q_nope": d.randn(4, H, LKV),
        "q_pe": d.randn(4, H, R),
        "ckv_cache": d.randn(NB, BS, LKV),
        "kpe_cache": d.randn(NB, BS, R),
        "meta": _meta(d),
        "scale": (128 + R) ** -0.5,
        "topk_indices": rows,
    }


def _layer_norm(d: Draw) -> dict:
    return {
        "x": d.randn(5, D),
        "weight": d.randn(D, dtype=torch.float32),
        "bias": d.randn(D, dtype=torch.float32),
        "eps": 1e-6,
    }


def _write_calls() -> list[Malformed]:
    w = "write_index_k"
    return [
        Malformed(w, "slot_past_cache", _write, put("slot_mapping", 1, NB * BS), "slot_mapping", index=True),
        Malformed(w, "slot_below_minus_one", _write, put("slot_mapping", 0, -3), "slot_mapping", index=True),
        Malformed(
            w, "slot_mapping_int32", _write, swap("slot_mapping", lambda s, d: s.to(torch.int32)), "slot_mapping"
        ),
        Malformed(w, "k_wrong_rank", _write, swap("k", lambda k, d: k[:, None]), "k"),
        Malformed(
            w, "cache_dtype_mismatch", _write, swap("index_cache", lambda c, d: c.to(torch.float16)), "index_cache"
        ),
        Malformed(
            w, "cache_dim_mismatch", _write, swap("index_cache", lambda c, d: d.randn(NB, BS, D // 2)), "index_cache"
        ),
        Malformed(w, "fp8_cache_without_scale", _write_fp8, swap("index_scale", lambda s, d: None), "index_scale"),
        Malformed(w, "fp8_scale_wrong_shape", _write_fp8, swap("index_scale", lambda s, d: s[:, :, :0]), "index_scale"),
        Malformed(
            w, "fp8_scale_bfloat16", _write_fp8, swap("index_scale", lambda s, d: s.to(torch.bfloat16)), "index_scale"
        ),
        Malformed(
            w,
            "scale_with_plain_cache",
            _write,
            swap("index_scale", lambda s, d: d.uniform(1e-3, 1e-2, NB, BS, 1)),
            "index_cache",
        ),
        Malformed(
            w,
            "fp8_dim_not_multiple_of_128",
            _write_fp8,
            lambda a, d: a.update(k=d.randn(5, 64), index_cache=d.randn(NB, BS, 64, dtype=FP8)),
            "index_cache",
        ),
    ]


def _indexer_calls() -> list[Malformed]:
    i = "indexer_topk"
    return [
        Malformed(
            i,
            "block_id_out_of_range",
            _indexer,
            meta_field("block_table", lambda t: altered(t, (0, 2), NB)),
            "meta.block_table",
            index=True,
        ),
        Malformed(
            i,
            "seq_lens_shorter_than_query",
            _indexer,
            meta_field("seq_lens", lambda t: altered(t, 0, 2)),
            "meta.seq_lens",
            index=True,
        ),
        Malformed(
            i,
            "query_start_loc_not_ending_at_T",
            _indexer,
            meta_field("query_start_loc", lambda t: altered(t, 2, 5)),
            "meta.query_start_loc",
            index=True,
        ),
        Malformed(i, "topk_zero", _indexer, swap("topk", lambda k, d: 0), "topk"),
        Malformed(i, "topk_float", _indexer, swap("topk", lambda k, d: float(TOPK)), "topk"),
        Malformed(i, "weights_bfloat16", _indexer, swap("weights", lambda w, d: w.to(torch.bfloat16)), "weights"),
        Malformed(
            i,
            "weights_heads_mismatch",
            _indexer,
            swap("weights", lambda w, d: d.uniform(0.1, 1.0, 4, HI - 1)),
            "weights",
        ),
        Malformed(
            i, "cache_dim_mismatch", _indexer, swap("index_cache", lambda c, d: d.randn(NB, BS, D + 64)), "index_cache"
        ),
        Malformed(i, "fp8_cache_without_scale", _indexer_fp8, swap("index_scale", lambda s, d: None), "index_scale"),
        Malformed(
            i,
            "fp8_scale_wrong_shape",
            _indexer_fp8,
            swap("index_scale", lambda s, d: d.uniform(1e-3, 1e-2, NB, BS)),
            "index_scale",
        ),
        Malformed(i, "meta_not_attention_meta", _indexer, swap("meta", lambda m, d: m.__dict__.copy()), "meta"),
        # spec 1.8: compressed keys
        Malformed(
            i, "compress_ratio_zero", _indexer_compressed, swap("compress_ratio", lambda r, d: 0), "compress_ratio"
        ),
        Malformed(
            i, "compress_ratio_bool", _indexer_compressed, swap("compress_ratio", lambda r, d: True), "compress_ratio"
        ),
        Malformed(
            i,
            "compressed_block_id_out_of_range",
            _indexer_compressed,
            meta_field("block_table", lambda t: altered(t, (1, 0), NB + 2)),
            "meta.block_table",
            index=True,
        ),
        Malformed(
            i,
            "compressed_table_too_narrow",
            _indexer_compressed,
            lambda a, d: a.update(meta=_more_entries(a["meta"])),
            "meta.block_table",
            index=True,
        ),
    ]


def _sparse_calls() -> list[Malformed]:
    m = "mla_attention"
    return [
        Malformed(m, "topk_indices_float", _sparse, swap("topk_indices", lambda t, d: t.float()), "topk_indices"),
        Malformed(
            m, "topk_indices_rows_mismatch", _sparse, swap("topk_indices", lambda t, d: t[:3].clone()), "topk_indices"
        ),
        Malformed(m, "topk_indices_1d", _sparse, swap("topk_indices", lambda t, d: t[:, 0].clone()), "topk_indices"),
        Malformed(
            m, "topk_indices_no_columns", _sparse, swap("topk_indices", lambda t, d: t[:, :0].clone()), "topk_indices"
        ),
        Malformed(
            m,
            "sparse_block_id_out_of_range",
            _sparse,
            meta_field("block_table", lambda t: altered(t, (1, 1), NB + 4)),
            "meta.block_table",
            index=True,
        ),
        # spec 1.7: the sparse path checks sinks as the dense one does (here: every rank's, unsplit)
        Malformed(
            m,
            "sparse_sinks_wrong_size",
            _sparse,
            swap("sinks", lambda s, d: d.randn(2 * H, dtype=torch.float32)),
            "sinks",
        ),
    ]


def _layer_norm_calls() -> list[Malformed]:
    n = "layer_norm"
    return [
        Malformed(
            n,
            "weight_wrong_size",
            _layer_norm,
            swap("weight", lambda w, d: d.randn(D - 1, dtype=torch.float32)),
            "weight",
        ),
        Malformed(n, "bias_float16", _layer_norm, swap("bias", lambda b, d: b.to(torch.float16)), "bias"),
        Malformed(n, "eps_zero", _layer_norm, swap("eps", lambda e, d: 0.0), "eps"),
        Malformed(n, "x_integer", _layer_norm, swap("x", lambda x, d: d.ints(5, 5, D)), "x"),
    ]


def calls() -> list[Malformed]:
    """The DSA ops' and layer_norm's malformed calls."""
    return _write_calls() + _indexer_calls() + _sparse_calls() + _layer_norm_calls()
