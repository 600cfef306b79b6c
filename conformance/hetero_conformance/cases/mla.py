"""Cases of the MLA ops: write_mla_kv and mla_attention.

Shapes are DeepSeek-V3's and DeepSeek-V2-Lite's (Lkv=512, R=64, with the yarn mscale in
the softmax scale); token counts and context lengths are scaled down. The caches hold
more blocks than the batch uses, filled with random values everywhere, and each
sequence's blocks are a random permutation (see ``_paged``). Edge cases are cases of
their own: one token, no tokens, block size 1, decode and prefill mixed, MTP, large
logits, non-contiguous views, -1 slots.
"""
from __future__ import annotations

from typing import Any

import torch

from hetero_conformance.case import Case
from hetero_conformance.cases._draw import randn
from hetero_conformance.cases._paged import FLOATS, QUICK_DTYPES, Seqs, blocks, meta, mla_scale, slots
from hetero_conformance.shapes import MODELS

__all__ = ["cases"]


def _write_mla_kv(model: str, bs: int, seqs: Seqs, skipped: int, views: bool = False):
    """write_mla_kv. ``views``: kv_c and k_pe are the two slices of kv_a_proj's [T, Lkv + R] output."""
    m = MODELS[model]
    lkv, r = m.kv_lora_rank, m.qk_rope_head_dim

    def build(gen: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        nb, slot_mapping = slots(gen, seqs, bs, skipped)
        t = slot_mapping.shape[0]
        if views:
            kv_c, k_pe = randn(gen, (t, lkv + r), dtype).split([lkv, r], dim=1)
        else:
            kv_c, k_pe = randn(gen, (t, lkv), dtype), randn(gen, (t, r), dtype)
        return {
            "kv_c": kv_c,
            "k_pe": k_pe,
            "ckv_cache": randn(gen, (nb, bs, lkv), dtype),
            "kpe_cache": randn(gen, (nb, bs, r), dtype),
            "slot_mapping": slot_mapping,
        }

    return build


def _mla(model: str, bs: int, seqs: Seqs, *, lse: bool = False, q_mag: float = 1.0, views: bool = False):
    """mla_attention. ``views``: q_nope as vLLM's absorbed bmm leaves it ([H, T, Lkv] transposed) and
    q_pe the rope slice of the [T, H, qk_nope + R] query projection."""
    m = MODELS[model]
    h, lkv, r, nope = m.heads, m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim

    def build(gen: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        nb, table = blocks(gen, [L for _, L in seqs], bs)
        t = sum(n for n, _ in seqs)
        if views:
            q_nope = randn(gen, (h, t, lkv), dtype, q_mag).transpose(0, 1)
            q_pe = randn(gen, (t, h, nope + r), dtype, q_mag)[..., nope:]
        else:
            q_nope, q_pe = randn(gen, (t, h, lkv), dtype, q_mag), randn(gen, (t, h, r), dtype, q_mag)
        return {
            "q_nope": q_nope,
            "q_pe": q_pe,
            "ckv_cache": randn(gen, (nb, bs, lkv), dtype),
            "kpe_cache": randn(gen, (nb, bs, r), dtype),
            "meta": meta(seqs, table),
            "scale": mla_scale(model),
            "causal": True,
            "return_lse": lse,
        }

    return build


def _static(dt: str, model: str, bs: int, lse: bool = False) -> dict[str, Any]:
    m = MODELS[model]
    return {"dtype": dt, "head_dim": m.kv_lora_rank + m.qk_rope_head_dim, "head_dim_v": m.kv_lora_rank,
            "kv_lora_rank": m.kv_lora_rank, "qk_rope_head_dim": m.qk_rope_head_dim, "num_heads": m.heads,
            "block_size": bs, **({"return_lse": True} if lse else {})}


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
        out.append(Case("write_mla_kv", shape, dt, _write_mla_kv(model, bs, seqs, skipped, views), _static(dt, model, bs), quick))
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
        static = _static(dt, model, bs, opts.get("lse", False))
        out.append(Case("mla_attention", shape, dt, _mla(model, bs, seqs, **opts), static, quick))
    return out


def cases() -> list[Case]:
    out: list[Case] = []
    for dt in FLOATS:
        out += _write_cases(dt) + _mla_cases(dt)
    return out
