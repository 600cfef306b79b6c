"""Malformed calls of compressed_attention (spec 1.8): the two paged caches, their block tables, the
window/ratio options, the sinks and the top-k list."""

from __future__ import annotations

import torch

from hetero.spec import AttentionMeta
from hetero_conformance.cases._malformed import Draw, Malformed, altered, meta_field, put, swap

__all__ = ["calls"]

OP = "compressed_attention"
NB, BS, NBC, BSC, H, D, W, M, K = 6, 16, 6, 4, 4, 64, 16, 4, 8  # heads and D shrunk; CSA's m = 4


def _base(d: Draw) -> dict:
    """A chunked prefill of 3 rows over 40 tokens (10 entries: 3 compressed blocks) and a decode row over
    17 (4 entries: 1 block), CSA with 8 listed entries per row."""
    meta = AttentionMeta.build([3, 1], [40, 17], d.perm(NB)[:6].reshape(2, 3), device=d.device)
    rows = torch.stack([d.perm(9)[:K] for _ in range(4)]).to(torch.int32)  # entries 0..8, some not yet closed
    rows[1, 2] = -1
    return {
        "query": d.randn(4, H, D),
        "kv_cache": d.randn(NB, BS, D),
        "comp_cache": d.randn(NBC, BSC, D),
        "meta": meta,
        "comp_block_table": d.perm(NBC, dtype=torch.int32)[:6].reshape(2, 3),
        "scale": D**-0.5,
        "window": W,
        "ratio": M,
        "sinks": d.uniform(0.0, 4.0, H),
        "topk_indices": rows,
        "return_lse": True,
    }


def _index_calls() -> list[Malformed]:
    return [
        Malformed(
            OP, "kv_block_id_out_of_range", _base, meta_field("block_table", lambda t: altered(t, (0, 2), NB)),
            "meta.block_table", index=True,
        ),
        Malformed(
            OP, "seq_lens_shorter_than_query", _base, meta_field("seq_lens", lambda t: altered(t, 0, 2)),
            "meta.seq_lens", index=True,
        ),
        Malformed(
            OP, "comp_block_id_out_of_range", _base, put("comp_block_table", (0, 2), NBC), "comp_block_table",
            index=True,
        ),
        Malformed(
            OP, "comp_block_id_negative", _base, put("comp_block_table", (1, 0), -1), "comp_block_table", index=True
        ),
        Malformed(  # sequence 0's 10 entries need 3 blocks of 4
            OP, "comp_block_table_too_narrow", _base, swap("comp_block_table", lambda t, d: t[:, :2].clone()),
            "comp_block_table", index=True,
        ),
    ]  # fmt: skip


def _argument_calls() -> list[Malformed]:
    f16 = lambda x, d: x.to(torch.float16)  # noqa: E731
    return [
        Malformed(OP, "query_wrong_rank", _base, swap("query", lambda q, d: q[:, 0].clone()), "query"),
        Malformed(OP, "kv_cache_dtype_mismatch", _base, swap("kv_cache", f16), "kv_cache"),
        Malformed(OP, "kv_cache_with_a_head_axis", _base, swap("kv_cache", lambda c, d: c[:, :, None]), "kv_cache"),
        Malformed(OP, "comp_cache_dim_mismatch", _base, swap("comp_cache", lambda c, d: d.randn(NBC, BSC, D // 2)),
                  "comp_cache"),
        Malformed(OP, "comp_cache_dtype_mismatch", _base, swap("comp_cache", f16), "comp_cache"),
        Malformed(OP, "comp_block_table_float", _base, swap("comp_block_table", lambda t, d: t.float()),
                  "comp_block_table"),
        Malformed(OP, "comp_block_table_rows_mismatch", _base, swap("comp_block_table", lambda t, d: t[:1].clone()),
                  "comp_block_table"),
        Malformed(OP, "window_zero", _base, swap("window", lambda w, d: 0), "window"),
        Malformed(OP, "window_pair", _base, swap("window", lambda w, d: (W - 1, -1)), "window"),
        Malformed(OP, "ratio_zero", _base, swap("ratio", lambda r, d: 0), "ratio"),
        Malformed(OP, "scale_nan", _base, swap("scale", lambda s, d: float("nan")), "scale"),
        Malformed(OP, "sinks_wrong_size", _base, swap("sinks", lambda s, d: d.uniform(0.0, 4.0, 2 * H)), "sinks"),
        Malformed(OP, "sinks_bfloat16", _base, swap("sinks", lambda s, d: s.to(torch.bfloat16)), "sinks"),
        Malformed(OP, "topk_indices_float", _base, swap("topk_indices", lambda t, d: t.float()), "topk_indices"),
        Malformed(OP, "topk_indices_rows_mismatch", _base, swap("topk_indices", lambda t, d: t[:3].clone()),
                  "topk_indices"),
        Malformed(OP, "return_lse_int", _base, swap("return_lse", lambda r, d: 1), "return_lse"),
        Malformed(OP, "meta_not_attention_meta", _base, swap("meta", lambda m, d: m.__dict__.copy()), "meta"),
    ]  # fmt: skip


def calls() -> list[Malformed]:
    """compressed_attention's malformed calls."""
    return _index_calls() + _argument_calls()
