"""Malformed calls of the attention ops: the paged cache writes, paged/MLA/varlen attention, merging."""

from __future__ import annotations

import dataclasses

import torch

from hetero.spec import AttentionMeta
from hetero_conformance.cases._malformed import Draw, Malformed, altered, meta_field, put, swap

__all__ = ["calls"]

NB, BS, HQ, HKV, D = 8, 16, 4, 2, 64  # a Qwen-like GQA cache, shrunk
LKV, R, H_MLA = 512, 64, 8  # DeepSeek's latent and rope widths


def _write_kv(d: Draw) -> dict:
    slots = d.perm(NB * BS)[:6].clone()
    slots[3] = -1  # a skipped token: legal
    return {
        "key": d.randn(6, HKV, D),
        "value": d.randn(6, HKV, D),
        "k_cache": d.randn(NB, BS, HKV, D),
        "v_cache": d.randn(NB, BS, HKV, D),
        "slot_mapping": slots,
    }


def _meta(d: Draw, query_lens: list[int], seq_lens: list[int], blocks: int, cols: int) -> AttentionMeta:
    table = d.perm(blocks)[: 2 * cols].reshape(2, cols)  # random, non-contiguous block ids
    return AttentionMeta.build(query_lens, seq_lens, table, device=d.device)


def _paged(d: Draw) -> dict:
    # a chunked prefill of 4 rows over 37 keys (3 blocks) and a decode row over 9 keys (1 block)
    return {
        "query": d.randn(5, HQ, D),
        "k_cache": d.randn(NB, BS, HKV, D),
        "v_cache": d.randn(NB, BS, HKV, D),
        "meta": _meta(d, [4, 1], [37, 9], NB, 3),
        "scale": D**-0.5,
    }


def _varlen(d: Draw) -> dict:
    return {
        "query": d.randn(7, HQ, D),
        "key": d.randn(10, HKV, D),
        "value": d.randn(10, HKV, D),
        "cu_seqlens_q": d.tensor([0, 3, 7]),
        "cu_seqlens_k": d.tensor([0, 4, 10]),
        "max_seqlen_q": 4,
        "max_seqlen_k": 6,
        "scale": D**-0.5,
    }


def _write_mla_kv(d: Draw) -> dict:
    return {
        "kv_c": d.randn(6, LKV),
        "k_pe": d.randn(6, R),
        "ckv_cache": d.randn(4, BS, LKV),
        "kpe_cache": d.randn(4, BS, R),
        "slot_mapping": d.perm(4 * BS)[:6].clone(),
    }


def _mla(d: Draw) -> dict:
    return {
        "q_nope": d.randn(4, H_MLA, LKV),
        "q_pe": d.randn(4, H_MLA, R),
        "ckv_cache": d.randn(6, BS, LKV),
        "kpe_cache": d.randn(6, BS, R),
        "meta": _meta(d, [3, 1], [40, 17], 6, 3),
        "scale": (128 + R) ** -0.5,
    }


def _merge(d: Draw) -> dict:
    return {
        "out_a": d.randn(5, HQ, D),
        "lse_a": d.randn(5, HQ, dtype=torch.float32),
        "out_b": d.randn(5, HQ, D),
        "lse_b": d.randn(5, HQ, dtype=torch.float32),
    }


def _longer_second_seq(meta: AttentionMeta) -> AttentionMeta:
    """seq_lens[1] one past what the block table's 3 columns hold (max_seq_len raised to match)."""
    lens = altered(meta.seq_lens, 1, 3 * BS + 1)
    return dataclasses.replace(meta, seq_lens=lens, max_seq_len=3 * BS + 1)


def _kv_calls() -> list[Malformed]:
    w, m = "write_kv", "write_mla_kv"
    return [
        Malformed(w, "slot_past_cache", _write_kv, put("slot_mapping", 1, NB * BS), "slot_mapping", index=True),
        Malformed(w, "slot_below_minus_one", _write_kv, put("slot_mapping", 0, -2), "slot_mapping", index=True),
        Malformed(
            w, "slot_mapping_int32", _write_kv, swap("slot_mapping", lambda s, d: s.to(torch.int32)), "slot_mapping"
        ),
        Malformed(
            w, "slot_mapping_too_short", _write_kv, swap("slot_mapping", lambda s, d: s[:-1].clone()), "slot_mapping"
        ),
        Malformed(w, "cache_dtype_mismatch", _write_kv, swap("k_cache", lambda c, d: c.to(torch.float16)), "k_cache"),
        Malformed(w, "value_heads_mismatch", _write_kv, swap("value", lambda v, d: d.randn(6, HKV + 1, D)), "value"),
        Malformed(m, "slot_past_cache", _write_mla_kv, put("slot_mapping", 2, 4 * BS + 5), "slot_mapping", index=True),
        Malformed(m, "slot_mapping_float", _write_mla_kv, swap("slot_mapping", lambda s, d: s.float()), "slot_mapping"),
        Malformed(
            m,
            "kpe_cache_wrong_width",
            _write_mla_kv,
            swap("kpe_cache", lambda c, d: d.randn(4, BS, R // 2)),
            "kpe_cache",
        ),
    ]


def _paged_calls() -> list[Malformed]:
    p = "paged_attention"
    return [
        Malformed(
            p,
            "block_id_out_of_range",
            _paged,
            meta_field("block_table", lambda t: altered(t, (0, 2), NB)),
            "meta.block_table",
            index=True,
        ),
        Malformed(
            p,
            "block_id_negative",
            _paged,
            meta_field("block_table", lambda t: altered(t, (1, 0), -1)),
            "meta.block_table",
            index=True,
        ),
        Malformed(
            p,
            "seq_lens_shorter_than_query",
            _paged,
            meta_field("seq_lens", lambda t: altered(t, 0, 2)),
            "meta.seq_lens",
            index=True,
        ),
        Malformed(
            p,
            "seq_lens_past_block_table",
            _paged,
            lambda a, d: a.update(meta=_longer_second_seq(a["meta"])),
            "meta.block_table",
            index=True,
        ),
        Malformed(
            p,
            "query_start_loc_decreasing",
            _paged,
            meta_field("query_start_loc", lambda t: altered(t, 1, 6)),
            "meta.query_start_loc",
            index=True,
        ),
        Malformed(
            p,
            "query_start_loc_not_ending_at_T",
            _paged,
            meta_field("query_start_loc", lambda t: altered(t, 2, 7)),
            "meta.query_start_loc",
            index=True,
        ),
        Malformed(
            p,
            "max_query_len_too_small",
            _paged,
            meta_field("max_query_len", lambda v: 1),
            "meta.max_query_len",
            index=True,
        ),
        Malformed(p, "window_negative", _paged, swap("window", lambda w, d: (-5, 0)), "window"),
        Malformed(p, "query_wrong_rank", _paged, swap("query", lambda q, d: q.flatten(1)), "query"),
        Malformed(
            p,
            "kv_heads_not_dividing",
            _paged,
            lambda a, d: a.update(k_cache=d.randn(NB, BS, 3, D), v_cache=d.randn(NB, BS, 3, D)),
            "k_cache",
        ),
        Malformed(p, "meta_not_attention_meta", _paged, swap("meta", lambda m, d: m.__dict__.copy()), "meta"),
        Malformed(
            p, "sinks_wrong_size", _paged, swap("sinks", lambda s, d: d.randn(HQ + 1, dtype=torch.float32)), "sinks"
        ),
        # gpt-oss: its checkpoint's bf16 sinks passed unconverted, and HF's sliding_window int passed as the window
        Malformed(p, "sinks_bfloat16", _paged, swap("sinks", lambda s, d: d.randn(HQ, dtype=torch.bfloat16)), "sinks"),
        Malformed(p, "window_hf_int", _paged, swap("window", lambda w, d: 128), "window"),
    ]


def _mla_calls() -> list[Malformed]:
    m = "mla_attention"
    return [
        Malformed(
            m,
            "block_id_out_of_range",
            _mla,
            meta_field("block_table", lambda t: altered(t, (0, 1), 6)),
            "meta.block_table",
            index=True,
        ),
        Malformed(
            m,
            "seq_lens_past_block_table",
            _mla,
            lambda a, d: a.update(meta=_longer_second_seq(a["meta"])),
            "meta.block_table",
            index=True,
        ),
        Malformed(
            m,
            "query_start_loc_not_ending_at_T",
            _mla,
            meta_field("query_start_loc", lambda t: altered(t, 2, 9)),
            "meta.query_start_loc",
            index=True,
        ),
        Malformed(m, "q_pe_heads_mismatch", _mla, swap("q_pe", lambda q, d: d.randn(4, H_MLA // 2, R)), "q_pe"),
        Malformed(
            m, "ckv_cache_wrong_latent", _mla, swap("ckv_cache", lambda c, d: d.randn(6, BS, LKV // 2)), "ckv_cache"
        ),
        # spec 1.7 (HY4): every rank's sinks passed unsplit under tensor parallelism, the checkpoint's bf16
        # sinks passed unconverted, a [1, H] parameter passed unsqueezed, and sinks left on the host
        Malformed(
            m, "sinks_of_every_rank", _mla, swap("sinks", lambda s, d: d.randn(2 * H_MLA, dtype=torch.float32)), "sinks"
        ),
        Malformed(m, "sinks_bfloat16", _mla, swap("sinks", lambda s, d: d.randn(H_MLA, dtype=torch.bfloat16)), "sinks"),
        Malformed(m, "sinks_2d", _mla, swap("sinks", lambda s, d: d.randn(1, H_MLA, dtype=torch.float32)), "sinks"),
        Malformed(m, "sinks_other_device", _mla, swap("sinks", _sinks_elsewhere), "sinks"),
    ]


def _sinks_elsewhere(s: object, d: Draw) -> torch.Tensor:
    """Sinks on another device than the call's: the host (the meta device when the call is on the host)."""
    return torch.randn(H_MLA, dtype=torch.float32, device="meta" if d.device.type == "cpu" else "cpu")


def _varlen_calls() -> list[Malformed]:
    v = "varlen_attention"
    return [
        Malformed(v, "cu_seqlens_not_ending_at_T", _varlen, put("cu_seqlens_q", 2, 8), "cu_seqlens_q", index=True),
        Malformed(v, "cu_seqlens_k_decreasing", _varlen, put("cu_seqlens_k", 1, 11), "cu_seqlens_k", index=True),
        Malformed(v, "cu_seqlens_not_starting_at_0", _varlen, put("cu_seqlens_k", 0, 1), "cu_seqlens_k", index=True),
        Malformed(
            v, "max_seqlen_k_too_small", _varlen, swap("max_seqlen_k", lambda x, d: 3), "max_seqlen_k", index=True
        ),
        Malformed(
            v,
            "cu_seqlens_batch_mismatch",
            _varlen,
            swap("cu_seqlens_k", lambda c, d: d.tensor([0, 2, 4, 10])),
            "cu_seqlens_k",
        ),
        Malformed(v, "cu_seqlens_float", _varlen, swap("cu_seqlens_q", lambda c, d: c.float()), "cu_seqlens_q"),
        Malformed(v, "value_length_mismatch", _varlen, swap("value", lambda x, d: d.randn(9, HKV, D)), "value"),
        Malformed(v, "window_negative", _varlen, swap("window", lambda w, d: (-5, 0)), "window"),
    ]


def _merge_calls() -> list[Malformed]:
    g = "merge_attention"
    return [
        Malformed(g, "lse_bfloat16", _merge, swap("lse_a", lambda x, d: x.to(torch.bfloat16)), "lse_a"),
        Malformed(
            g,
            "lse_shape_mismatch",
            _merge,
            swap("lse_b", lambda x, d: d.randn(5, HQ - 1, dtype=torch.float32)),
            "lse_b",
        ),
        Malformed(g, "out_dtype_mismatch", _merge, swap("out_b", lambda x, d: x.to(torch.float16)), "out_b"),
    ]


def calls() -> list[Malformed]:
    """The attention family's malformed calls."""
    return _kv_calls() + _paged_calls() + _varlen_calls() + _mla_calls() + _merge_calls()
