"""Cases of mla_attention's sinks (spec 1.7), on Hunyuan HY4's shapes (``hetero.verify.inputs.mla_sinks``).

32 query heads (``hy4``) and one rank's 16 under 2-way tensor parallelism (``hy4.tp2``), Lkv 512,
R 64, scale (192 + 64) ** -0.5, per-head float32 sinks; dense MLA (decode, prefill, chunked
prefill, mixed) and sparse MLA with top-k 2048 (256 at the short contexts). Token counts and
contexts are scaled down. Edge cases are cases of their own: sinks of +-20 (one swamps every key,
one is nothing), rows that see no key (out 0 and lse -inf whatever the sink), out without lse (no
fused path without sinks may serve it), a strided sinks view.
"""

from __future__ import annotations

from hetero.verify.case import Case
from hetero.verify.inputs import mla_sinks as draw
from hetero.verify.inputs.paged import FLOATS

__all__ = ["cases"]


def _dense(dt: str) -> list[Case]:
    rows = [
        ("hy4.sinks.decode.b4.ctx300", draw.HY4, [(1, 300), (1, 1), (1, 65), (1, 130)], {}, dt != "float16"),
        ("hy4.tp2.sinks.mixed", draw.HY4_TP2, [(12, 12), (1, 200), (5, 90)], {}, dt == "float32"),
        ("hy4.sinks20.decode.b2", draw.HY4, [(1, 150), (1, 3)], {"sinks": 20.0}, dt == "bfloat16"),
        ("hy4.tp2.sinks.prefill.no-lse", draw.HY4_TP2, [(40, 40)], {"lse": False}, dt == "bfloat16"),
        ("hy4.tp2.sinks-strided.decode.b2", draw.HY4_TP2, [(1, 70), (1, 9)], {"strided": True}, False),
    ]
    return [
        Case(
            "mla_attention",
            shape,
            dt,
            draw.mla_sinks(m, 64, seqs, **opts),
            draw.static(dt, m, 64, lse=opts.get("lse", True)),
            quick,
        )
        for shape, m, seqs, opts, quick in rows
    ]


def _sparse(dt: str) -> list[Case]:
    rows = [
        ("hy4.sinks.sparse.decode.b3.k2048", draw.HY4, [(1, 2600), (1, 2048), (1, 900)], 2048, {}, dt == "bfloat16"),
        (
            "hy4.tp2.sinks.sparse.skipped-entries.k2048",
            draw.HY4_TP2,
            [(6, 300), (1, 2100), (2, 2)],
            2048,
            {"beyond": 4, "empty": 1},
            dt == "float32",
        ),
        (
            "hy4.sinks20.sparse.mixed.k256",
            draw.HY4,
            [(4, 64), (1, 700)],
            256,
            {"sinks": 20.0, "empty": 2},
            dt != "float16",
        ),
        ("hy4.tp2.sinks.sparse.chunked-prefill.k2048", draw.HY4_TP2, [(16, 2100)], 2048, {"beyond": 3}, False),
        ("hy4.tp2.sinks.sparse.prefill.no-lse.k256", draw.HY4_TP2, [(48, 48)], 256, {"lse": False}, False),
    ]
    return [
        Case(
            "mla_attention",
            shape,
            dt,
            draw.mla_sinks(m, 64, seqs, k=k, **opts),
            draw.static(dt, m, 64, k=k, lse=opts.get("lse", True)),
            quick,
        )
        for shape, m, seqs, k, opts, quick in rows
    ]


def cases() -> list[Case]:
    out: list[Case] = []
    for dt in FLOATS:
        out += _dense(dt) + _sparse(dt)
    return out
