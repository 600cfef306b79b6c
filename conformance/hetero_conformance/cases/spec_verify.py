"""Cases of speculative-decoding verification (issue 36): paged_attention, dense and sparse
mla_attention and indexer_topk called as a verification step calls them.

Each sequence of a batch has a long context already in the paged cache (random blocks, a
random permutation per sequence, more blocks than the batch uses) and 1 + k new query rows,
the last token and k draft tokens, at consecutive positions at the end of that context, with
k mixed across the batch (k = 3, 0, 4, 1, ...; k = 0 is a plain decode row). The drafts' own
keys are in the cache, so a row that sees a later draft (causality within the new rows
broken), a row that takes another row's position or a kernel that assumes one row per
sequence changes the result. The shapes are real models' (Qwen3-8B GQA 32:8 D=128,
DeepSeek-V3 MLA 128 heads Lkv 512 R 64, DeepSeek-V3.2 indexer 64 x 128 with top-k 2048);
only the context lengths are scaled down, and the edges are placed on purpose: draft rows that
straddle a block boundary, a sliding window whose start moves with each draft row, indexer
rows on both sides of the top-k boundary (some keep every key, the next ones prune), and
sparse rows that list a later draft's position, which must be skipped. Full tier only.
"""

from __future__ import annotations

from typing import Any

from hetero.verify.case import Case
from hetero.verify.inputs import attention as paged_draw
from hetero.verify.inputs import dsa as dsa_draw
from hetero.verify.inputs import mla as mla_draw
from hetero.verify.inputs.paged import FLOATS, heads

__all__ = ["cases"]

# (1 + k query rows, context length including them) per sequence, k = 3, 0, 4, 1 (and 2)
GQA = [(4, 1500), (1, 700), (5, 1027), (2, 333), (3, 64)]  # positions 1022..1026 straddle a block (bs 16)
WINDOWED = [(4, 300), (1, 128), (5, 131), (2, 40)]  # window 127: each row's first key differs
MLA = [(4, 900), (1, 257), (5, 66), (2, 130)]  # positions 61..65 straddle a block (bs 64)
INDEXER = [(4, 3000), (1, 2049), (5, 2052), (2, 700), (3, 2047)]  # rows see 2048..2052 keys: top-k edge
SPARSE = [(4, 2600), (1, 2100), (5, 2051), (2, 900)]


def _paged(dt: str) -> list[Case]:
    q8, oss = heads("qwen3-8b"), heads("gpt-oss-20b")
    sliding = {"window": (127, -1), "sinks": True, "lse": True}
    rows = [
        ("qwen3-8b.spec-verify.k3-0-4-1-2", q8, 16, GQA, {"lse": True}),
        ("gpt-oss-20b.sliding128.sinks.spec-verify.k3-0-4-1", oss, 16, WINDOWED, sliding),
    ]
    return [
        Case(
            "paged_attention",
            shape,
            dt,
            paged_draw.paged(h, bs, seqs, **opts),
            paged_draw.static_paged(dt, h, bs, opts),
            False,
        )
        for shape, h, bs, seqs, opts in rows
    ]


def _mla(dt: str) -> list[Case]:
    shape, model, bs = "deepseek-v3.spec-verify.k3-0-4-1", "deepseek-v3", 64
    return [
        Case("mla_attention", shape, dt, mla_draw.mla(model, bs, MLA, lse=True), mla_draw.static(dt, model, bs, True))
    ]


def _indexer_static(dt: str, m: Any, bs: int, fp8: bool) -> dict[str, Any]:
    return {"dtype": dt, "num_heads": m.hi, "head_dim": m.d, "block_size": bs, "topk": m.topk, "index_scale": fp8}


def _indexer(dt: str) -> list[Case]:
    m = dsa_draw.V32
    rows = [
        ("deepseek-v3.2.spec-verify.k3-0-4-1-2", INDEXER, False),
        ("deepseek-v3.2.fp8.spec-verify.k4-1-2", [(5, 2300), (2, 2049), (3, 1200)], True),
    ]
    return [
        Case("indexer_topk", shape, dt, dsa_draw.indexer(m, 64, seqs, fp8=fp8), _indexer_static(dt, m, 64, fp8))
        for shape, seqs, fp8 in rows
    ]


def _sparse_static(dt: str, m: Any, bs: int, k: int) -> dict[str, Any]:
    st = {"dtype": dt, "head_dim": m.lkv + m.rope, "head_dim_v": m.lkv, "kv_lora_rank": m.lkv}
    st.update({"qk_rope_head_dim": m.rope, "num_heads": m.heads, "block_size": bs})
    return {**st, "topk_indices": True, "topk": k, "return_lse": True}


def _sparse(dt: str) -> list[Case]:
    rows = [
        # beyond=1: each row also lists the next draft's position (pos + 1, in the cache), to be skipped
        ("deepseek-v3.2.tp8.sparse.spec-verify.k3-0-4-1.k2048", dsa_draw.V32_TP8, SPARSE, {"beyond": 1}),
        ("deepseek-v3.2.sparse.spec-verify.k2-4.k2048", dsa_draw.V32, [(3, 2300), (5, 2050)], {}),
    ]
    return [
        Case("mla_attention", shape, dt, dsa_draw.sparse(m, 64, seqs, 2048, **opts), _sparse_static(dt, m, 64, 2048))
        for shape, m, seqs, opts in rows
    ]


def cases() -> list[Case]:
    """The verification cases, every float dtype, none in the quick tier."""
    out: list[Case] = []
    for dt in FLOATS:
        out += _paged(dt) + _mla(dt) + _indexer(dt) + _sparse(dt)
    return out
