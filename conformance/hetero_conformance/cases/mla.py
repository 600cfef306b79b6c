"""Cases of the MLA ops: write_mla_kv and mla_attention.

Shapes are DeepSeek-V3's and DeepSeek-V2-Lite's (Lkv=512, R=64, with the yarn mscale in
the softmax scale); token counts and context lengths are scaled down. The caches hold
more blocks than the batch uses, filled with random values everywhere, and each
sequence's blocks are a random permutation (see ``_paged``). Edge cases are cases of
their own: one token, no tokens, block size 1, decode and prefill mixed, MTP, large
logits, non-contiguous views, -1 slots.
"""

from __future__ import annotations

from hetero.verify.case import Case
from hetero.verify.inputs import mla as draw
from hetero.verify.inputs.paged import FLOATS, QUICK_DTYPES

__all__ = ["cases"]


def _write_cases(dt: str) -> list[Case]:
    q = dt in QUICK_DTYPES
    out = []
    for shape, model, bs, seqs, skipped, views, quick in [
        ("deepseek-v3.bs64.mixed", "deepseek-v3", 64, [(21, 21), (1, 130), (9, 70)], 4, False, q),
        ("deepseek-v3.noncontig.bs64", "deepseek-v3", 64, [(1, 100), (6, 6)], 2, True, False),
        ("deepseek-v2-lite.bs16.decode.b3", "deepseek-v2-lite", 16, [(1, 40), (1, 16), (1, 17)], 1, False, False),
        ("deepseek-v3.bs1", "deepseek-v3", 1, [(5, 5), (1, 9)], 2, False, False),
        ("deepseek-v3.t1", "deepseek-v3", 64, [(1, 1)], 0, False, False),
        ("deepseek-v3.t0", "deepseek-v3", 64, [], 0, False, False),
    ]:
        out.append(
            Case(
                "write_mla_kv",
                shape,
                dt,
                draw.write_mla_kv(model, bs, seqs, skipped, views),
                draw.static(dt, model, bs),
                quick,
            )
        )
    return out


def _mla_cases(dt: str) -> list[Case]:
    q = dt in QUICK_DTYPES
    out = []
    for shape, model, bs, seqs, opts, quick in [
        ("deepseek-v3.decode.b4.ctx200", "deepseek-v3", 64, [(1, 200), (1, 1), (1, 65), (1, 130)], {"lse": True}, q),
        ("deepseek-v3.mtp.q2.b3", "deepseek-v3", 64, [(2, 90), (2, 2), (2, 64)], {"lse": True}, False),
        ("deepseek-v2-lite.decode.b3.bs16", "deepseek-v2-lite", 16, [(1, 100), (1, 33), (1, 16)], {}, False),
        ("deepseek-v2-lite.mixed.b2", "deepseek-v2-lite", 16, [(12, 12), (1, 50)], {"lse": True}, False),
        ("deepseek-v3.decode.noncontig-q", "deepseek-v3", 64, [(1, 80), (1, 21)], {"views": True, "lse": True}, False),
        ("deepseek-v3.decode.bs1", "deepseek-v3", 1, [(1, 40), (1, 9)], {}, False),
        ("deepseek-v3.large-logits.decode", "deepseek-v3", 64, [(1, 150), (1, 70)], {"q_mag": 5.0, "lse": True}, False),
        ("deepseek-v3.t1.ctx1", "deepseek-v3", 64, [(1, 1)], {"lse": True}, False),
        ("deepseek-v3.t0", "deepseek-v3", 64, [], {"lse": True}, False),
    ]:
        static = draw.static(dt, model, bs, opts.get("lse", False))
        out.append(Case("mla_attention", shape, dt, draw.mla(model, bs, seqs, **opts), static, quick))
    return out


def cases() -> list[Case]:
    out: list[Case] = []
    for dt in FLOATS:
        out += _write_cases(dt) + _mla_cases(dt)
    return out
