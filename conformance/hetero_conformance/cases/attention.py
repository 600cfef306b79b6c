"""Cases of the attention ops: write_kv, paged_attention, varlen_attention and merge_attention
(the MLA ops are in ``mla``).

Head counts and head dims are those of real models (GQA ratios 1, 2, 4, 8, 16 and
MQA; MLA prefill with D=192, Dv=128); token counts and context lengths are scaled
down. Paged caches always hold more blocks than the batch uses, filled with random
values everywhere, and each sequence's blocks are a random permutation, so reading a
wrong block, a block past the end or an unwritten slot changes the result. Edge cases
are cases of their own: one token, no tokens, lengths that are not a multiple of the
block size, prefill and decode mixed, chunked prefill, sliding windows, fully masked
rows, softcap, sinks, large logits, non-contiguous views, -1 slots.
"""

from __future__ import annotations

from hetero.verify.case import Case
from hetero.verify.inputs import attention as draw
from hetero.verify.inputs.paged import FLOATS, QUICK_DTYPES, Heads, heads, mla_scale
from hetero.verify.shapes import MODELS

__all__ = ["cases"]


# ----------------------------------------------------------------------------- the catalog

QWEN3_NEXT = Heads(16, 2, 256)  # Qwen3-Next-80B-A3B's full attention (not in shapes.MODELS)
# Batches, as (query rows, KV length) per sequence; lengths mostly not multiples of the block size.
DECODE4 = [(1, 300), (1, 17), (1, 129), (1, 64)]
MIXED4 = [(37, 37), (1, 201), (20, 150), (1, 33)]  # fresh prefill, decode, chunked prefill, decode


def _paged_cases(dt: str) -> list[Case]:
    q = dt in QUICK_DTYPES
    q8, oss = heads("qwen3-8b"), heads("gpt-oss-20b")  # gpt-oss-120b has 20b's attention geometry
    sliding = {"window": (127, -1), "sinks": True, "lse": True}
    rows = [
        # (shape, heads, block size, batch, options, quick)
        ("qwen3-8b.decode.b4.ctx300", q8, 16, DECODE4, {"lse": True}, q),
        ("qwen3-8b.mixed.b4", q8, 16, MIXED4, {"lse": True}, q),
        ("llama-3-8b.prefill.b2.bs64", heads("llama-3-8b"), 64, [(45, 45), (70, 70)], {}, False),
        (
            "qwen3-0.6b.chunked.q16.ctx200.bs64",
            heads("qwen3-0.6b"),
            64,
            [(16, 200), (9, 71), (1, 64)],
            {"lse": True},
            False,
        ),
        ("qwen3-32b.decode.b3.bs64", heads("qwen3-32b"), 64, [(1, 130), (1, 64), (1, 65)], {"lse": True}, False),
        ("qwen3-235b-a22b.decode.b2", heads("qwen3-235b-a22b"), 16, [(1, 90), (1, 47)], {}, False),
        (
            "qwen3-30b-a3b.spec-decode.q3.b3",
            heads("qwen3-30b-a3b"),
            16,
            [(3, 50), (3, 3), (3, 97)],
            {"lse": True},
            False,
        ),
        ("llama-2-7b.mha.decode.b2", heads("llama-2-7b"), 16, [(1, 75), (1, 20)], {}, False),
        ("falcon-7b.mqa.mixed", heads("falcon-7b"), 16, [(12, 12), (1, 55)], {"lse": True}, False),
        ("qwen3-8b.window50.mixed", q8, 16, [(30, 30), (1, 180), (25, 140)], {"window": (50, -1), "lse": True}, q),
        ("gpt-oss-20b.sinks.window128.mixed", oss, 16, [(1, 200), (20, 160), (5, 5)], sliding, False),
        # gpt-oss: HF sliding_window 128 (W keys, its own included) is window (127, -1); full layers alternate
        (
            "gpt-oss-20b.sliding128.sinks.window-edge.decode",
            oss,
            16,
            [(1, 127), (1, 128), (1, 129), (1, 300)],
            sliding,
            dt == "bfloat16",
        ),
        ("gpt-oss-20b.sliding128.sinks.chunked", oss, 16, [(48, 176), (150, 150), (1, 140)], sliding, dt == "float32"),
        ("gpt-oss-120b.full.sinks.mixed", oss, 16, [(1, 300), (30, 170), (9, 9)], {"sinks": True, "lse": True}, False),
        (
            "gpt-oss-20b.sliding128.sinks-dominate.few-keys",
            oss,
            16,
            [(5, 5), (1, 1), (3, 3), (1, 2)],
            {**sliding, "sinks": (8.0, 12.0)},
            False,
        ),  # rows of 1-5 keys against e^8..e^12: the sink takes almost all
        (
            "gemma-2-9b.softcap50.large-logits.mixed",
            heads("gemma-2-9b"),
            16,
            [(17, 17), (1, 90)],
            {"softcap": 50.0, "q_mag": 40.0, "lse": True},
            False,
        ),
        (
            "qwen3-8b.softcap50.sinks.large-logits.mixed",
            q8,
            16,
            [(9, 9), (1, 110), (6, 60)],
            {"softcap": 50.0, "sinks": True, "q_mag": 40.0, "lse": True},
            dt == "float32",
        ),
        ("qwen3-8b.large-logits.mixed", q8, 16, [(1, 120), (1, 33), (4, 40)], {"q_mag": 16.0, "lse": True}, False),
        ("qwen3-8b.t1.ctx1", q8, 16, [(1, 1)], {"lse": True}, False),
        ("qwen3-8b.t0", q8, 16, [], {"lse": True}, False),
        (
            "qwen3-8b.noncontig.mixed",
            q8,
            16,
            [(5, 5), (0, 40), (1, 77)],
            {"views": True, "lse": True},
            dt == "bfloat16",
        ),
        ("qwen3-8b.decode.alloc-out", q8, 16, [(1, 70), (1, 31)], {"alloc_out": True}, False),
        ("qwen3-8b.decode.bs128", q8, 128, [(1, 300), (1, 100)], {}, False),
        # Qwen3-Next / Qwen3.5 full-attention layers: GQA 16:2, head dim 256
        ("qwen3-next.d256.mixed", QWEN3_NEXT, 16, [(21, 21), (1, 150), (9, 70)], {"lse": True}, dt == "bfloat16"),
        ("qwen3-next.d256.decode.b3.bs64", QWEN3_NEXT, 64, [(1, 200), (1, 65), (1, 1)], {}, False),
    ]
    return [
        Case("paged_attention", shape, dt, draw.paged(h, bs, seqs, **opts), draw.static_paged(dt, h, bs, opts), quick)
        for shape, h, bs, seqs, opts, quick in rows
    ]


def _varlen_cases(dt: str) -> list[Case]:
    q = dt in QUICK_DTYPES
    q8, v3, v2 = heads("qwen3-8b"), heads("deepseek-v3"), heads("deepseek-v2-lite")
    dv = MODELS["deepseek-v3"].v_head_dim
    mla3 = {"dv": dv, "scale": mla_scale("deepseek-v3"), "lse": True}  # MLA prefill: D=192, Dv=128, mscale
    mla2 = {"dv": dv, "scale": mla_scale("deepseek-v2-lite"), "lse": True}
    rows = [
        ("deepseek-v3.mla-prefill.b3", v3, [(13, 13), (30, 30), (5, 5)], {**mla3, "view": "mla"}, q),
        (
            "deepseek-v2-lite.mla-prefill.context-chunk",
            v2,
            [(10, 64), (7, 32)],
            {**mla2, "view": "mla", "causal": False},
            False,
        ),
        ("deepseek-v2-lite.mla-prefill.chunked.b3", v2, [(10, 50), (7, 7), (1, 33)], mla2, False),
        ("qwen3-8b.chunked.b2", q8, [(10, 50), (1, 33)], {}, False),
        ("qwen3-8b.prefill.qkv-view.b3", q8, [(20, 20), (33, 33), (1, 1)], {"view": "qkv"}, False),
        # rows at positions < -4 (or with no keys at all) see nothing: out 0, lse -inf
        (
            "qwen3-8b.noncausal.window8-4.fully-masked",
            q8,
            [(12, 5), (6, 20), (4, 0)],
            {"causal": False, "window": (8, 4), "lse": True},
            dt == "float32",
        ),
        ("qwen3-8b.fewer-keys.fully-masked", q8, [(10, 4), (3, 3)], {"lse": True}, False),
        (
            "qwen3-0.6b.window16.prefill",
            heads("qwen3-0.6b"),
            [(40, 40), (25, 60)],
            {"window": (16, -1), "lse": True},
            False,
        ),
        (
            "gemma-2-9b.softcap50.large-logits.prefill",
            heads("gemma-2-9b"),
            [(24, 24), (9, 9)],
            {"softcap": 50.0, "q_mag": 40.0},
            False,
        ),
        ("qwen3-235b-a22b.prefill.b2", heads("qwen3-235b-a22b"), [(19, 19), (8, 30)], {}, False),
        ("falcon-7b.mqa.prefill.b2", heads("falcon-7b"), [(15, 15), (6, 6)], {"lse": True}, False),
        ("qwen3-8b.large-logits.prefill", q8, [(30, 30)], {"q_mag": 16.0, "lse": True}, False),
        ("qwen3-8b.t1", q8, [(1, 1)], {"lse": True}, False),
        ("qwen3-8b.t0", q8, [(0, 6), (0, 0)], {"lse": True}, False),
    ]
    out = []
    for shape, h, seqs, opts, quick in rows:
        static = {
            "dtype": dt,
            "head_dim": h.d,
            "head_dim_v": opts.get("dv", h.d),
            "num_heads": h.hq,
            "num_kv_heads": h.hkv,
            "causal": opts.get("causal", True),
            "window": opts.get("window", (-1, -1)),
            "softcap": opts.get("softcap", 0.0),
        }
        out.append(Case("varlen_attention", shape, dt, draw.varlen(h, seqs, **opts), static, quick))
    return out


def _write_cases(dt: str) -> list[Case]:
    q = dt in QUICK_DTYPES
    q8 = heads("qwen3-8b")
    out = []
    for shape, h, bs, seqs, skipped, views, quick in [
        ("qwen3-8b.bs16.mixed", q8, 16, [(37, 37), (1, 201), (20, 150)], 5, False, q),
        (
            "qwen3-0.6b.bs64.decode.b5",
            heads("qwen3-0.6b"),
            64,
            [(1, 130), (1, 1), (1, 64), (1, 65), (1, 200)],
            3,
            False,
            False,
        ),
        ("qwen3-8b.noncontig.bs16", q8, 16, [(9, 30), (1, 17)], 2, True, False),
        ("falcon-7b.mqa.bs16", heads("falcon-7b"), 16, [(12, 12), (1, 55)], 2, False, False),
        ("qwen3-8b.all-skipped", q8, 16, [], 4, False, False),
        ("qwen3-8b.t1", q8, 16, [(1, 1)], 0, False, False),
        ("qwen3-8b.t0", q8, 16, [], 0, False, False),
    ]:
        static = {"dtype": dt, "head_dim": h.d, "head_dim_v": h.d, "block_size": bs, "num_kv_heads": h.hkv}
        out.append(Case("write_kv", shape, dt, draw.write_kv(h, bs, seqs, skipped, views), static, quick))
    return out


def _merge_cases(dt: str) -> list[Case]:
    q = dt in QUICK_DTYPES
    v3, q8 = MODELS["deepseek-v3"], MODELS["qwen3-8b"]
    out = []
    for shape, t, h, dv, opts, quick in [
        ("deepseek-v3.mla-prefill.t9", 9, v3.heads, v3.v_head_dim, {}, q),
        ("deepseek-v3.mla-decode.t3", 3, v3.heads, v3.kv_lora_rank, {}, False),
        ("qwen3-8b.t5.lse-transposed", 5, q8.heads, q8.head_dim, {"lse_view": True}, False),
        # lse up to ~110 (logits of that size): exp(lse) overflows float32
        ("deepseek-v3.large-lse.t4", 4, v3.heads, v3.v_head_dim, {"lo": -20.0, "hi": 110.0}, dt == "float32"),
        ("qwen3-8b.t1", 1, q8.heads, q8.head_dim, {}, False),
        ("qwen3-8b.t0", 0, q8.heads, q8.head_dim, {}, False),
    ]:
        static = {"dtype": dt, "head_dim": dv, "num_heads": h}
        out.append(Case("merge_attention", shape, dt, draw.merge(t, h, dv, **opts), static, quick))
    return out


def cases() -> list[Case]:
    out: list[Case] = []
    for dt in FLOATS:
        out += _write_cases(dt) + _paged_cases(dt) + _varlen_cases(dt) + _merge_cases(dt)
    return out
