"""Cases of the attention ops: write_kv, paged_attention, varlen_attention, write_mla_kv,
mla_attention and merge_attention.

Head counts and head dims are those of real models (GQA ratios 1, 2, 4, 8, 16 and
MQA; DeepSeek MLA with Lkv=512, R=64 and MLA prefill with D=192, Dv=128); token
counts and context lengths are scaled down. Paged caches always hold more blocks
than the batch uses, filled with random values everywhere, and each sequence's
blocks are a random permutation, so reading a wrong block, a block past the end or
an unwritten slot changes the result. Edge cases are cases of their own: one
token, no tokens, lengths that are not a multiple of the block size, prefill and
decode mixed, chunked prefill, sliding windows, fully masked rows, softcap, sinks,
large logits, non-contiguous views, -1 slots.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from hetero.spec.types import AttentionMeta

from hetero_conformance.case import Case
from hetero_conformance.cases._draw import perm, randn, uniform
from hetero_conformance.shapes import MODELS

__all__ = ["cases"]

FLOATS = ("float32", "float16", "bfloat16")
QUICK_DTYPES = ("float32", "bfloat16")

Seqs = Sequence[tuple[int, int]]  # (query rows n, KV length L) per sequence, L >= n for the paged ops


@dataclass(frozen=True)
class Heads:
    """The attention geometry of a model: query heads, KV heads, head dim."""

    hq: int
    hkv: int
    d: int


def _heads(model: str) -> Heads:
    m = MODELS[model]
    return Heads(m.heads, m.kv_heads, m.head_dim)


#: Real configurations shapes.MODELS lacks, for features those models do not use:
#: Gemma-2-9B (head dim 256, attention softcap 50), gpt-oss-20b (head dim 64,
#: sliding window 128, attention sinks), Llama-2-7B (MHA, GQA ratio 1) and
#: Falcon-7B (MQA with 71 query heads, not a power of two).
EXTRA = {
    "gemma-2-9b": Heads(16, 8, 256),
    "gpt-oss-20b": Heads(64, 8, 64),
    "llama-2-7b": Heads(32, 32, 128),
    "falcon-7b": Heads(71, 1, 64),
}


def _geom(model: str) -> Heads:
    return EXTRA[model] if model in EXTRA else _heads(model)


def _yarn_mscale(factor: float, mscale_all_dim: float) -> float:
    """DeepSeek's yarn attention-scale correction; its softmax scale is multiplied by the square."""
    return 0.1 * mscale_all_dim * math.log(factor) + 1.0 if factor > 1 else 1.0


#: DeepSeek rope_scaling: yarn factor 40 with mscale_all_dim 1.0 (V3) and 0.707 (V2-Lite).
MLA_MSCALE = {"deepseek-v3": _yarn_mscale(40, 1.0), "deepseek-v2-lite": _yarn_mscale(40, 0.707)}


def _mla_scale(model: str) -> float:
    m = MODELS[model]
    return (m.qk_nope_head_dim + m.qk_rope_head_dim) ** -0.5 * MLA_MSCALE[model] ** 2


# ----------------------------------------------------------------------------- paged layout


def _blocks(gen: torch.Generator, kv_lens: Sequence[int], bs: int) -> tuple[int, list[list[int]]]:
    """A cache of NB blocks (more than used) and each sequence's block ids, drawn from a random
    permutation; rows are padded (one column more than the longest needs) with valid, unrelated ids."""
    need = [-(-L // bs) for L in kv_lens]
    used = sum(need)
    nb = used + max(3, used // 2)
    ids = perm(gen, nb).tolist()
    width = max(need, default=0) + 1
    rows, at = [], 0
    for k in need:
        row = ids[at : at + k]
        at += k
        pad = torch.randint(0, nb, (width - k,), generator=gen).tolist()
        rows.append(row + pad)
    return nb, rows


def _slots(gen: torch.Generator, seqs: Seqs, bs: int, skipped: int) -> tuple[int, torch.Tensor]:
    """(NB, slot_mapping int64 [T]) of one engine step: sequence b writes positions L-n..L-1 into its
    randomly permuted blocks, and ``skipped`` extra tokens (padding, half of them in the middle of
    the batch, the rest at the end) carry -1."""
    nb, table = _blocks(gen, [L for _, L in seqs], bs)
    slots = [table[b][p // bs] * bs + p % bs for b, (n, L) in enumerate(seqs) for p in range(L - n, L)]
    middle = skipped // 2
    for _ in range(middle):
        slots.insert(int(torch.randint(0, len(slots) + 1, (1,), generator=gen)), -1)
    slots += [-1] * (skipped - middle)
    return nb, torch.tensor(slots, dtype=torch.int64)


def _meta(seqs: Seqs, table: list[list[int]]) -> AttentionMeta:
    return AttentionMeta.build([n for n, _ in seqs], [L for _, L in seqs], table)


# ----------------------------------------------------------------------------- builders


def _paged(
    h: Heads,
    bs: int,
    seqs: Seqs,
    *,
    causal: bool = True,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: bool = False,
    lse: bool = False,
    q_mag: float = 1.0,
    views: bool = False,
    alloc_out: bool = False,
):
    """paged_attention over random caches. ``views``: query is a slice of a packed qkv tensor and
    the caches are the K and V halves of one [NB, 2, BS, Hkv, D] tensor (FlashInfer's layout)."""

    def build(gen: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        nb, table = _blocks(gen, [L for _, L in seqs], bs)
        t = sum(n for n, _ in seqs)
        if views:
            qkv = randn(gen, (t, (h.hq + 2 * h.hkv) * h.d), dtype)
            qkv[:, : h.hq * h.d] *= q_mag
            query = qkv[:, : h.hq * h.d].unflatten(1, (h.hq, h.d))
            kv = randn(gen, (nb, 2, bs, h.hkv, h.d), dtype)
            k_cache, v_cache = kv[:, 0], kv[:, 1]
        else:
            query = randn(gen, (t, h.hq, h.d), dtype, q_mag)
            k_cache = randn(gen, (nb, bs, h.hkv, h.d), dtype)
            v_cache = randn(gen, (nb, bs, h.hkv, h.d), dtype)
        args: dict[str, Any] = {
            "query": query,
            "k_cache": k_cache,
            "v_cache": v_cache,
            "meta": _meta(seqs, table),
            "scale": h.d**-0.5,
            "causal": causal,
            "window": window,
            "softcap": softcap,
            "return_lse": lse,
        }
        if sinks:  # around the lse of ~100 keys, so the sink takes a real share of the softmax
            args["sinks"] = uniform(gen, (h.hq,), -1.0, 6.0)
        if alloc_out:
            args["out"] = None
        return args

    return build


def _varlen(
    h: Heads,
    seqs: Seqs,
    *,
    dv: int | None = None,
    causal: bool = True,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    lse: bool = False,
    q_mag: float = 1.0,
    view: str = "",
    scale: float | None = None,
):
    """varlen_attention. ``view``: "qkv" (query, key, value slices of one packed projection; needs
    n == L) or "mla" (value the second half of [Tk, H, qk_nope + Dv], as MLA prefill splits kv_b_proj).
    ``scale`` defaults to D ** -0.5 (MLA prefill passes DeepSeek's, with the yarn mscale)."""
    dv = dv or h.d

    def build(gen: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        tq, tk = sum(n for n, _ in seqs), sum(L for _, L in seqs)
        if view == "qkv":
            assert tq == tk and dv == h.d
            qkv = randn(gen, (tq, h.hq + 2 * h.hkv, h.d), dtype)
            qkv[:, : h.hq] *= q_mag
            query, key, value = qkv.split([h.hq, h.hkv, h.hkv], dim=1)
        else:
            query = randn(gen, (tq, h.hq, h.d), dtype, q_mag)
            key = randn(gen, (tk, h.hkv, h.d), dtype)
            if view == "mla":  # kv_b_proj's output [Tk, H, qk_nope + Dv] split into k_nope and v
                nope = h.d - MODELS["deepseek-v3"].qk_rope_head_dim
                value = randn(gen, (tk, h.hkv, nope + dv), dtype)[..., nope:]
            else:
                value = randn(gen, (tk, h.hkv, dv), dtype)
        cq, ck = [0], [0]
        for n, L in seqs:
            cq.append(cq[-1] + n)
            ck.append(ck[-1] + L)
        return {
            "query": query,
            "key": key,
            "value": value,
            "cu_seqlens_q": torch.tensor(cq, dtype=torch.int32),
            "cu_seqlens_k": torch.tensor(ck, dtype=torch.int32),
            "max_seqlen_q": max((n for n, _ in seqs), default=0),
            "max_seqlen_k": max((L for _, L in seqs), default=0),
            "scale": h.d**-0.5 if scale is None else scale,
            "causal": causal,
            "window": window,
            "softcap": softcap,
            "return_lse": lse,
        }

    return build


def _write_kv(h: Heads, bs: int, seqs: Seqs, skipped: int, views: bool = False):
    """write_kv of one step's tokens into random caches. ``views``: key and value are slices of a
    packed qkv tensor and the caches the halves of one [NB, 2, BS, Hkv, D] tensor."""

    def build(gen: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        nb, slots = _slots(gen, seqs, bs, skipped)
        t = slots.shape[0]
        if views:
            qkv = randn(gen, (t, h.hq + 2 * h.hkv, h.d), dtype)
            _, key, value = qkv.split([h.hq, h.hkv, h.hkv], dim=1)
            kv = randn(gen, (nb, 2, bs, h.hkv, h.d), dtype)
            k_cache, v_cache = kv[:, 0], kv[:, 1]
        else:
            key, value = randn(gen, (t, h.hkv, h.d), dtype), randn(gen, (t, h.hkv, h.d), dtype)
            k_cache, v_cache = randn(gen, (nb, bs, h.hkv, h.d), dtype), randn(gen, (nb, bs, h.hkv, h.d), dtype)
        return {"key": key, "value": value, "k_cache": k_cache, "v_cache": v_cache, "slot_mapping": slots}

    return build


def _write_mla_kv(model: str, bs: int, seqs: Seqs, skipped: int, views: bool = False):
    """write_mla_kv. ``views``: kv_c and k_pe are the two slices of kv_a_proj's [T, Lkv + R] output."""
    m = MODELS[model]
    lkv, r = m.kv_lora_rank, m.qk_rope_head_dim

    def build(gen: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        nb, slots = _slots(gen, seqs, bs, skipped)
        t = slots.shape[0]
        if views:
            kv_c, k_pe = randn(gen, (t, lkv + r), dtype).split([lkv, r], dim=1)
        else:
            kv_c, k_pe = randn(gen, (t, lkv), dtype), randn(gen, (t, r), dtype)
        return {
            "kv_c": kv_c,
            "k_pe": k_pe,
            "ckv_cache": randn(gen, (nb, bs, lkv), dtype),
            "kpe_cache": randn(gen, (nb, bs, r), dtype),
            "slot_mapping": slots,
        }

    return build


def _mla(model: str, bs: int, seqs: Seqs, *, lse: bool = False, q_mag: float = 1.0, views: bool = False):
    """mla_attention. ``views``: q_nope as vLLM's absorbed bmm leaves it ([H, T, Lkv] transposed) and
    q_pe the rope slice of the [T, H, qk_nope + R] query projection."""
    m = MODELS[model]
    h, lkv, r, nope = m.heads, m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim

    def build(gen: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        nb, table = _blocks(gen, [L for _, L in seqs], bs)
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
            "meta": _meta(seqs, table),
            "scale": _mla_scale(model),
            "causal": True,
            "return_lse": lse,
        }

    return build


def _merge(t: int, h: int, dv: int, *, lo: float = -2.0, hi: float = 12.0, lse_view: bool = False):
    """merge_attention of two partials: random outputs, lse in [lo, hi]; about 15% of the (token,
    head) rows are -inf on side a only, 15% on b only, 10% on both, and the last token is empty on
    both sides (a padding token). Outputs of empty rows stay random: they must carry no weight.
    ``lse_view``: the lse are [H, T] tensors transposed, as flash-attn returns them."""

    def build(gen: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        out_a, out_b = randn(gen, (t, h, dv), dtype), randn(gen, (t, h, dv), dtype)
        lse_a, lse_b = uniform(gen, (h, t), lo, hi), uniform(gen, (h, t), lo, hi)
        u = uniform(gen, (h, t), 0.0, 1.0)
        inf = float("-inf")
        lse_a = lse_a.masked_fill((u < 0.15) | (u >= 0.9), inf)
        lse_b = lse_b.masked_fill(((u >= 0.15) & (u < 0.3)) | (u >= 0.9), inf)
        if t:
            lse_a[:, -1] = lse_b[:, -1] = inf
        lse_a, lse_b = lse_a.t(), lse_b.t()
        if not lse_view:
            lse_a, lse_b = lse_a.contiguous(), lse_b.contiguous()
        return {"out_a": out_a, "lse_a": lse_a, "out_b": out_b, "lse_b": lse_b}

    return build


# ----------------------------------------------------------------------------- static configurations


def _static_paged(dt: str, h: Heads, bs: int, **opts: Any) -> dict[str, Any]:
    st = {"dtype": dt, "head_dim": h.d, "head_dim_v": h.d, "block_size": bs, "num_heads": h.hq, "num_kv_heads": h.hkv}
    st.update({"causal": True, "window": (-1, -1), "softcap": 0.0, "sinks": False})
    st.update(opts)
    return st


def _static_mla(dt: str, model: str, bs: int | None) -> dict[str, Any]:
    m = MODELS[model]
    st = {"dtype": dt, "head_dim": m.kv_lora_rank + m.qk_rope_head_dim, "head_dim_v": m.kv_lora_rank,
          "kv_lora_rank": m.kv_lora_rank, "qk_rope_head_dim": m.qk_rope_head_dim, "num_heads": m.heads}
    if bs is not None:
        st["block_size"] = bs
    return st


# ----------------------------------------------------------------------------- the catalog

# Batches, as (query rows, KV length) per sequence; lengths mostly not multiples of the block size.
DECODE4 = [(1, 300), (1, 17), (1, 129), (1, 64)]
MIXED4 = [(37, 37), (1, 201), (20, 150), (1, 33)]  # fresh prefill, decode, chunked prefill, decode


def _paged_cases(dt: str) -> list[Case]:
    q = dt in QUICK_DTYPES
    q8 = _heads("qwen3-8b")
    rows = [
        # (shape, heads, block size, batch, options, quick)
        ("qwen3-8b.decode.b4.ctx300", q8, 16, DECODE4, {"lse": True}, q),
        ("qwen3-8b.mixed.b4", q8, 16, MIXED4, {"lse": True}, q),
        ("llama-3-8b.prefill.b2.bs64", _heads("llama-3-8b"), 64, [(45, 45), (70, 70)], {}, False),
        ("qwen3-0.6b.chunked.q16.ctx200.bs64", _heads("qwen3-0.6b"), 64, [(16, 200), (9, 71), (1, 64)], {"lse": True}, False),
        ("qwen3-32b.decode.b3.bs64", _heads("qwen3-32b"), 64, [(1, 130), (1, 64), (1, 65)], {"lse": True}, False),
        ("qwen3-235b-a22b.decode.b2", _heads("qwen3-235b-a22b"), 16, [(1, 90), (1, 47)], {}, False),
        ("qwen3-30b-a3b.spec-decode.q3.b3", _heads("qwen3-30b-a3b"), 16, [(3, 50), (3, 3), (3, 97)], {"lse": True}, False),
        ("llama-2-7b.mha.decode.b2", EXTRA["llama-2-7b"], 16, [(1, 75), (1, 20)], {}, False),
        ("falcon-7b.mqa.mixed", EXTRA["falcon-7b"], 16, [(12, 12), (1, 55)], {"lse": True}, False),
        ("qwen3-8b.window50.mixed", q8, 16, [(30, 30), (1, 180), (25, 140)], {"window": (50, -1), "lse": True}, q),
        ("gpt-oss-20b.sinks.window128.mixed", EXTRA["gpt-oss-20b"], 16, [(1, 200), (20, 160), (5, 5)],
         {"window": (127, -1), "sinks": True, "lse": True}, False),
        ("gemma-2-9b.softcap50.large-logits.mixed", EXTRA["gemma-2-9b"], 16, [(17, 17), (1, 90)],
         {"softcap": 50.0, "q_mag": 40.0, "lse": True}, False),
        ("qwen3-8b.softcap50.sinks.large-logits.mixed", q8, 16, [(9, 9), (1, 110), (6, 60)],
         {"softcap": 50.0, "sinks": True, "q_mag": 40.0, "lse": True}, dt == "float32"),
        ("qwen3-8b.large-logits.mixed", q8, 16, [(1, 120), (1, 33), (4, 40)], {"q_mag": 16.0, "lse": True}, False),
        ("qwen3-8b.t1.ctx1", q8, 16, [(1, 1)], {"lse": True}, False),
        ("qwen3-8b.t0", q8, 16, [], {"lse": True}, False),
        ("qwen3-8b.noncontig.mixed", q8, 16, [(5, 5), (0, 40), (1, 77)], {"views": True, "lse": True}, dt == "bfloat16"),
        ("qwen3-8b.decode.alloc-out", q8, 16, [(1, 70), (1, 31)], {"alloc_out": True}, False),
        ("qwen3-8b.decode.bs128", q8, 128, [(1, 300), (1, 100)], {}, False),
    ]
    out = []
    for shape, h, bs, seqs, opts, quick in rows:
        static = _static_paged(dt, h, bs, **{k: opts[k] for k in ("window", "softcap") if k in opts}, sinks=bool(opts.get("sinks")))
        out.append(Case("paged_attention", shape, dt, _paged(h, bs, seqs, **opts), static, quick))
    return out


def _varlen_cases(dt: str) -> list[Case]:
    q = dt in QUICK_DTYPES
    q8, v3, v2 = _heads("qwen3-8b"), _heads("deepseek-v3"), _heads("deepseek-v2-lite")
    dv = MODELS["deepseek-v3"].v_head_dim
    mla3 = {"dv": dv, "scale": _mla_scale("deepseek-v3"), "lse": True}  # MLA prefill: D=192, Dv=128, mscale
    mla2 = {"dv": dv, "scale": _mla_scale("deepseek-v2-lite"), "lse": True}
    rows = [
        ("deepseek-v3.mla-prefill.b3", v3, [(13, 13), (30, 30), (5, 5)], {**mla3, "view": "mla"}, q),
        ("deepseek-v2-lite.mla-prefill.context-chunk", v2, [(10, 64), (7, 32)], {**mla2, "view": "mla", "causal": False}, False),
        ("deepseek-v2-lite.mla-prefill.chunked.b3", v2, [(10, 50), (7, 7), (1, 33)], mla2, False),
        ("qwen3-8b.chunked.b2", q8, [(10, 50), (1, 33)], {}, False),
        ("qwen3-8b.prefill.qkv-view.b3", q8, [(20, 20), (33, 33), (1, 1)], {"view": "qkv"}, False),
        # rows at positions < -4 (or with no keys at all) see nothing: out 0, lse -inf
        ("qwen3-8b.noncausal.window8-4.fully-masked", q8, [(12, 5), (6, 20), (4, 0)],
         {"causal": False, "window": (8, 4), "lse": True}, dt == "float32"),
        ("qwen3-8b.fewer-keys.fully-masked", q8, [(10, 4), (3, 3)], {"lse": True}, False),
        ("qwen3-0.6b.window16.prefill", _heads("qwen3-0.6b"), [(40, 40), (25, 60)], {"window": (16, -1), "lse": True}, False),
        ("gemma-2-9b.softcap50.large-logits.prefill", EXTRA["gemma-2-9b"], [(24, 24), (9, 9)], {"softcap": 50.0, "q_mag": 40.0}, False),
        ("qwen3-235b-a22b.prefill.b2", _heads("qwen3-235b-a22b"), [(19, 19), (8, 30)], {}, False),
        ("falcon-7b.mqa.prefill.b2", EXTRA["falcon-7b"], [(15, 15), (6, 6)], {"lse": True}, False),
        ("qwen3-8b.large-logits.prefill", q8, [(30, 30)], {"q_mag": 16.0, "lse": True}, False),
        ("qwen3-8b.t1", q8, [(1, 1)], {"lse": True}, False),
        ("qwen3-8b.t0", q8, [(0, 6), (0, 0)], {"lse": True}, False),
    ]
    out = []
    for shape, h, seqs, opts, quick in rows:
        static = {"dtype": dt, "head_dim": h.d, "head_dim_v": opts.get("dv", h.d), "num_heads": h.hq, "num_kv_heads": h.hkv,
                  "causal": opts.get("causal", True), "window": opts.get("window", (-1, -1)), "softcap": opts.get("softcap", 0.0)}
        out.append(Case("varlen_attention", shape, dt, _varlen(h, seqs, **opts), static, quick))
    return out


def _write_cases(dt: str) -> list[Case]:
    q = dt in QUICK_DTYPES
    q8 = _heads("qwen3-8b")
    out = []
    for shape, h, bs, seqs, skipped, views, quick in [
        ("qwen3-8b.bs16.mixed", q8, 16, [(37, 37), (1, 201), (20, 150)], 5, False, q),
        ("qwen3-0.6b.bs64.decode.b5", _heads("qwen3-0.6b"), 64, [(1, 130), (1, 1), (1, 64), (1, 65), (1, 200)], 3, False, False),
        ("qwen3-8b.noncontig.bs16", q8, 16, [(9, 30), (1, 17)], 2, True, False),
        ("falcon-7b.mqa.bs16", EXTRA["falcon-7b"], 16, [(12, 12), (1, 55)], 2, False, False),
        ("qwen3-8b.all-skipped", q8, 16, [], 4, False, False),
        ("qwen3-8b.t1", q8, 16, [(1, 1)], 0, False, False),
        ("qwen3-8b.t0", q8, 16, [], 0, False, False),
    ]:
        static = {"dtype": dt, "head_dim": h.d, "head_dim_v": h.d, "block_size": bs, "num_kv_heads": h.hkv}
        out.append(Case("write_kv", shape, dt, _write_kv(h, bs, seqs, skipped, views), static, quick))
    for shape, model, bs, seqs, skipped, views, quick in [
        ("deepseek-v3.bs64.mixed", "deepseek-v3", 64, [(21, 21), (1, 130), (9, 70)], 4, False, q),
        ("deepseek-v3.noncontig.bs64", "deepseek-v3", 64, [(1, 100), (6, 6)], 2, True, False),
        ("deepseek-v2-lite.bs16.decode.b3", "deepseek-v2-lite", 16, [(1, 40), (1, 16), (1, 17)], 1, False, False),
        ("deepseek-v3.bs1", "deepseek-v3", 1, [(5, 5), (1, 9)], 2, False, False),
        ("deepseek-v3.t1", "deepseek-v3", 64, [(1, 1)], 0, False, False),
        ("deepseek-v3.t0", "deepseek-v3", 64, [], 0, False, False),
    ]:
        out.append(Case("write_mla_kv", shape, dt, _write_mla_kv(model, bs, seqs, skipped, views), _static_mla(dt, model, bs), quick))
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
        out.append(Case("mla_attention", shape, dt, _mla(model, bs, seqs, **opts), _static_mla(dt, model, bs), quick))
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
        out.append(Case("merge_attention", shape, dt, _merge(t, h, dv, **opts), static, quick))
    return out


def cases() -> list[Case]:
    out: list[Case] = []
    for dt in FLOATS:
        out += _write_cases(dt) + _paged_cases(dt) + _varlen_cases(dt) + _mla_cases(dt) + _merge_cases(dt)
    return out
