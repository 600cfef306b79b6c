"""Cases of compressed_attention (spec 1.8), on DeepSeek-V4's shapes (``hetero.verify.inputs.compressed_attention``).

V4-Flash's 64 query heads (``v4-flash``), one rank's 32 under 2-way tensor parallelism (``v4-flash.tp2``)
and V4-Pro's 128 (``v4-pro``) over one K=V head of 512, a window of 128 raw rows, per-head sinks. HCA
layers (m = 128, every closed entry) at prompts of a few windows; CSA layers (m = 4) with the indexer's
top 512 and a top 16 that prunes hard. Decode, prefill, chunked prefill and mixed batches; contexts are
scaled down. Edge cases are cases of their own: rows that see no compressed entry yet, prompts shorter
than the window, a decode whose last window has just closed (L a multiple of m), a chunk whose rows
straddle a window's close, top-k rows listing entries a row cannot see, compressed blocks of 1 entry
and of several, sinks of +-20, calls without lse.
"""

from __future__ import annotations

from hetero.verify.case import Case
from hetero.verify.inputs import compressed_attention as draw
from hetero.verify.inputs.compressed_attention import CSA, HCA, V4_FLASH, V4_FLASH_TP2, V4_PRO

__all__ = ["cases"]

_OP = "compressed_attention"
DTYPES = ("float32", "bfloat16")


def _hca(dt: str) -> list[Case]:
    f32, bf16 = dt == "float32", dt == "bfloat16"
    rows = [
        # decode past several windows, at a just-closed window (256), one entry (130), before any (60)
        ("v4-flash.hca.decode.b4", V4_FLASH, [(1, 1000), (1, 256), (1, 130), (1, 60)], 1, {}, bf16),
        # rows 376..399: entry 2 closes at 383, inside the chunk
        ("v4-pro.hca.chunked-prefill.straddles-close", V4_PRO, [(24, 400)], 2, {}, f32),
        ("v4-flash.tp2.hca.prefill", V4_FLASH_TP2, [(160, 160)], 1, {}, False),
        # a long decode, a fresh prompt shorter than the window, a chunk past two closes, decode at 127 and 128
        ("v4-flash.hca.mixed.bsc4", V4_FLASH, [(1, 3000), (16, 16), (8, 264), (1, 127), (1, 128)], 4, {}, False),
        ("v4-flash.hca.sinks20.decode.b2", V4_FLASH, [(1, 700), (1, 40)], 1, {"sinks": 20.0}, False),
        ("v4-flash.tp2.hca.decode.no-lse", V4_FLASH_TP2, [(1, 520), (1, 385)], 1, {"lse": False}, f32),
    ]
    return [
        Case(
            _OP,
            shape,
            dt,
            draw.compressed_attention(m, HCA, seqs, bsc=bsc, **opts),
            draw.static(dt, m, HCA, 64, bsc, lse=opts.get("lse", True)),
            quick,
        )  # fmt: skip
        for shape, m, seqs, bsc, opts, quick in rows
    ]


def _csa(dt: str) -> list[Case]:
    f32, bf16 = dt == "float32", dt == "bfloat16"
    rows = [
        # 650 entries (pruned to 512), 225 (padded), 7, and a row before the first close
        ("v4-flash.csa.decode.b4.k512", V4_FLASH, [(1, 2600), (1, 900), (1, 30), (1, 3)], 512, 16, {}, bf16),
        ("v4-pro.csa.chunked-prefill.k512", V4_PRO, [(16, 600)], 512, 16, {}, f32),
        # a fresh prompt (its first rows see no entry) beside a chunk whose 73+ entries a top 16 prunes
        ("v4-flash.tp2.csa.mixed.k16", V4_FLASH_TP2, [(40, 40), (8, 300)], 16, 4, {}, f32),
        ("v4-flash.csa.skipped-entries.k512", V4_FLASH, [(6, 300), (1, 2100), (2, 9)], 512, 16, {"beyond": 3}, bf16),
        ("v4-flash.csa.sinks20.bsc1.k512", V4_FLASH, [(1, 2200), (4, 60)], 512, 1, {"sinks": 20.0}, False),
        ("v4-pro.csa.prefill.no-lse.k512", V4_PRO, [(48, 48)], 512, 16, {"lse": False}, False),
    ]
    return [
        Case(
            _OP,
            shape,
            dt,
            draw.compressed_attention(m, CSA, seqs, bsc=bsc, topk=k, **opts),
            draw.static(dt, m, CSA, 64, bsc, topk=k, lse=opts.get("lse", True)),
            quick,
        )  # fmt: skip
        for shape, m, seqs, k, bsc, opts, quick in rows
    ]


def cases() -> list[Case]:
    out: list[Case] = []
    for dt in DTYPES:
        out += _hca(dt) + _csa(dt)
    return out
