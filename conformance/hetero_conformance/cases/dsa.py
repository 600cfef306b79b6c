"""Cases of the DSA ops (spec 1.3): write_index_k, indexer_topk and sparse mla_attention.

Geometry is DeepSeek-V3.2's and GLM-5's (``hetero.verify.inputs.dsa_draw.DSA``): indexer Hi 64 / 32 heads of D 128,
top-k 2048; absorbed MLA with Lkv 512, R 64 and 128 / 64 heads (``tp8``: one rank's heads of
an 8-way tensor-parallel deployment, as the quick tier uses). Only the token counts are scaled
down: contexts run from a handful of keys to 3000, so some rows keep fewer keys than top-k
(-1 padding), some exactly top-k and some choose among more. indexer_topk's inputs are on the
grid of ``hetero.verify.inputs.dsa_draw`` (every evaluation computes the same scores: a unique answer), its caches
random everywhere, its sequences' blocks random permutations (``_paged``).

Edge cases are cases of their own: decode, chunked prefill (the query rows are the last n of a
longer context), prefill shorter than top-k, top-k 1, exact ties (keys drawn from a small pool),
signed weights, block size 16 and 1, the fp8 key format (values halfway between two e4m3 values,
groups below the amax floor, large values), sparse rows padded with -1, rows listing positions
they cannot see (past pos, past the cache, below -1), rows listing nothing, int64 indices,
strided k, no tokens.
"""

from __future__ import annotations

from hetero.verify.case import Case
from hetero.verify.inputs import dsa as draw
from hetero.verify.inputs.paged import FLOATS

__all__ = ["cases"]


def _write_cases(dt: str) -> list[Case]:
    quick = dt in ("float32", "bfloat16")
    mixed = [(21, 21), (1, 130), (9, 70)]
    rows = [
        ("deepseek-v3.2.bs64.mixed", 64, mixed, 4, {}, quick),
        ("deepseek-v3.2.bs64.mixed.fp8-edges", 64, mixed, 4, {"fp8": True, "edges": True}, quick),
        ("deepseek-v3.2.bs64.decode.b8.fp8", 64, [(1, 300 + 97 * b) for b in range(8)], 2, {"fp8": True}, False),
        ("deepseek-v3.2.bs64.k-view", 64, [(1, 100), (6, 6)], 2, {"view": True}, False),
        ("deepseek-v3.2.bs1.fp8", 1, [(5, 5), (1, 9)], 2, {"fp8": True}, False),
        ("deepseek-v3.2.t1", 64, [(1, 1)], 0, {}, False),
        ("deepseek-v3.2.t0", 64, [], 0, {"fp8": True}, False),
    ]
    return [
        Case(
            "write_index_k",
            shape,
            dt,
            draw.write(draw.V32, bs, seqs, skipped, **opts),
            {"dtype": dt, "head_dim": draw.V32.d, "block_size": bs, "index_scale": bool(opts.get("fp8"))},
            q,
        )
        for shape, bs, seqs, skipped, opts, q in rows
    ]


def _indexer_cases(dt: str) -> list[Case]:
    quick = dt in ("float32", "bfloat16")
    decode = [(1, 3000), (1, 2048), (1, 2049), (1, 700)]
    rows = [
        ("deepseek-v3.2.decode.b4.ctx700-3000", draw.V32, 64, decode, {}, dt == "bfloat16"),
        ("deepseek-v3.2.prefill.short", draw.V32, 64, [(160, 160), (1, 90)], {}, dt == "float32"),
        ("deepseek-v3.2.ties.decode.b2", draw.V32, 64, [(1, 2500), (1, 2300)], {"pool": 16}, quick),
        ("deepseek-v3.2.topk1.mixed", draw.V32, 64, [(6, 40), (1, 77), (3, 3)], {"topk": 1}, dt == "float32"),
        (
            "deepseek-v3.2.fp8.decode.b3",
            draw.V32,
            64,
            [(1, 2600), (1, 2100), (1, 500)],
            {"fp8": True},
            dt == "bfloat16",
        ),
        ("deepseek-v3.2.chunked-prefill", draw.V32, 64, [(40, 2070), (16, 2600)], {}, False),
        ("deepseek-v3.2.mixed", draw.V32, 64, [(1, 2500), (24, 24), (0, 500), (1, 1), (8, 2300)], {}, False),
        ("deepseek-v3.2.fp8.chunked-prefill", draw.V32, 64, [(24, 2080)], {"fp8": True}, False),
        ("deepseek-v3.2.ties.chunked-prefill", draw.V32, 64, [(32, 2300)], {"pool": 24}, False),
        ("deepseek-v3.2.signed-weights.decode.b2", draw.V32, 64, [(1, 2400), (1, 2200)], {"signed": True}, False),
        ("deepseek-v3.2.bs16.mixed", draw.V32, 16, [(1, 2200), (5, 300)], {}, False),
        ("deepseek-v3.2.bs1.mixed", draw.V32, 1, [(1, 70), (4, 4)], {"topk": 32}, False),
        ("glm-5.decode.b3", draw.GLM5, 64, [(1, 2600), (1, 2050), (1, 300)], {}, False),
        ("glm-5.chunked-prefill", draw.GLM5, 64, [(20, 2060), (1, 3000)], {}, False),
        ("deepseek-v3.2.t0", draw.V32, 64, [], {}, False),
    ]
    out = []
    for shape, m, bs, seqs, opts, q in rows:
        static = {
            "dtype": dt,
            "num_heads": m.hi,
            "head_dim": m.d,
            "block_size": bs,
            "topk": opts.get("topk", m.topk),
            "index_scale": bool(opts.get("fp8")),
        }
        out.append(Case("indexer_topk", shape, dt, draw.indexer(m, bs, seqs, **opts), static, q))
    return out


def _sparse_cases(dt: str) -> list[Case]:
    rows = [
        (
            "deepseek-v3.2.tp8.sparse.decode.b3.k2048",
            draw.V32_TP8,
            64,
            [(1, 2600), (1, 2048), (1, 900)],
            2048,
            {},
            dt == "bfloat16",
        ),
        (
            "deepseek-v3.2.tp8.sparse.skipped-entries",
            draw.V32_TP8,
            64,
            [(6, 300), (1, 2100), (2, 2)],
            2048,
            {"beyond": 4, "empty": 1},
            dt == "float32",
        ),
        ("deepseek-v3.2.tp8.sparse.topk1", draw.V32_TP8, 64, [(3, 500), (1, 1)], 1, {}, dt == "float32"),
        ("deepseek-v3.2.sparse.decode.b2.k2048", draw.V32, 64, [(1, 2500), (1, 2200)], 2048, {}, False),
        ("glm-5.sparse.decode.b2.k2048", draw.GLM5, 64, [(1, 2300), (1, 2100)], 2048, {}, False),
        ("deepseek-v3.2.tp8.sparse.chunked-prefill", draw.V32_TP8, 64, [(16, 2100)], 2048, {"beyond": 3}, False),
        ("deepseek-v3.2.tp8.sparse.mtp.q2.int64", draw.V32_TP8, 64, [(2, 2300), (2, 40)], 2048, {"idx64": True}, False),
        ("deepseek-v3.2.tp8.sparse.prefill.short", draw.V32_TP8, 64, [(64, 64)], 2048, {}, False),
        ("glm-5.tp8.sparse.bs16.mixed", draw.GLM5_TP8, 16, [(1, 2200), (7, 90), (1, 1)], 2048, {"beyond": 2}, False),
        ("deepseek-v3.2.tp8.sparse.t0", draw.V32_TP8, 64, [], 2048, {}, False),
    ]
    out = []
    for shape, m, bs, seqs, k, opts, q in rows:
        static = {
            "dtype": dt,
            "head_dim": m.lkv + m.rope,
            "head_dim_v": m.lkv,
            "kv_lora_rank": m.lkv,
            "qk_rope_head_dim": m.rope,
            "num_heads": m.heads,
            "block_size": bs,
            "topk_indices": True,
            "topk": k,
            "return_lse": True,
        }
        out.append(Case("mla_attention", shape, dt, draw.sparse(m, bs, seqs, k, **opts), static, q))
    return out


def cases() -> list[Case]:
    out: list[Case] = []
    for dt in FLOATS:
        out += _write_cases(dt) + _indexer_cases(dt) + _sparse_cases(dt)
    return out
