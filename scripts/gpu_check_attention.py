"""The attention-family benchmark cases of scripts/gpu_check.py: paged (with gpt-oss's sinks and sliding
window), varlen, MLA dense and sparse (DeepSeek-V3.2's DSA; Hunyuan HY4's with per-head sinks, spec 1.7),
the cache writes, merge and the lightning indexer (DeepSeek-V4's over compressed keys too, spec 1.8). See
gpu_check_sizes for the Bench record and how bytes and flops are counted.
"""

from __future__ import annotations

import math

import torch
from gpu_check_sizes import Bench, Sizes, nbytes, paged_meta, randn, visible, windowed

from hetero.spec import AttentionMeta

__all__ = ["attention_benches", "sparse_indices"]

MLA_BLOCK = 64  # DeepSeek's latent and index caches share 64-token blocks
HY4_HEADS = 32  # Hunyuan HY4's query heads at TP 1 (the smoke sizes' MLA heads when fewer); scale (192 + 64) ** -0.5


def _paged(
    case: str, qlens: list[int], kvlens: list[int], s: Sizes, heads: tuple[int, int, int], window: int = 0
) -> Bench:
    """``window`` W > 0: a sliding window of W keys (``window=(W - 1, -1)``) with per-head sinks (gpt-oss)."""
    hq, hkv, d = heads

    def make(dev):
        meta, nblk = paged_meta(qlens, kvlens, s.block, dev)
        q = randn((sum(qlens), hq, d), dev)
        kc, vc = randn((nblk, s.block, hkv, d), dev), randn((nblk, s.block, hkv, d), dev)
        inputs = {"query": q, "k_cache": kc, "v_cache": vc, "meta": meta, "scale": d**-0.5, "causal": True}
        if window:
            inputs.update(window=(window - 1, -1), sinks=torch.randn(hq, device=dev))
            seen, read = (sum(x) for x in zip(*(windowed(n, L, window) for n, L in zip(qlens, kvlens))))
        else:
            seen, read = sum(visible(n, L) for n, L in zip(qlens, kvlens)), sum(kvlens)
        return inputs, 4.0 * hq * d * seen, 2 * nbytes(q) + read * hkv * 2 * d * 2

    return Bench("paged_attention", case, "bfloat16", make)


def _varlen(s: Sizes) -> Bench:
    (b, n), (hq, hkv, d) = s.prefill, s.heads

    def make(dev):
        q, k, v = randn((b * n, hq, d), dev), randn((b * n, hkv, d), dev), randn((b * n, hkv, d), dev)
        cu = torch.arange(0, b * n + 1, n, dtype=torch.int32, device=dev)
        inputs = {
            "query": q,
            "key": k,
            "value": v,
            "cu_seqlens_q": cu,
            "cu_seqlens_k": cu,
            "max_seqlen_q": n,
            "max_seqlen_k": n,
            "scale": d**-0.5,
            "causal": True,
        }
        return inputs, 4.0 * hq * d * b * visible(n, n), nbytes(q, k, v, q)

    return Bench("varlen_attention", f"prefill {b}x{n} Hq{hq} Hkv{hkv} D{d}", "bfloat16", make)


def _write_kv(s: Sizes) -> Bench:
    (b, n), (_hq, hkv, d) = s.prefill, s.heads

    def make(dev):
        t = b * n
        k, v = randn((t, hkv, d), dev), randn((t, hkv, d), dev)
        nblk = math.ceil(t / s.block)
        kc, vc = randn((nblk, s.block, hkv, d), dev), randn((nblk, s.block, hkv, d), dev)
        slots = torch.arange(t, dtype=torch.int64, device=dev)
        return (
            {"key": k, "value": v, "k_cache": kc, "v_cache": vc, "slot_mapping": slots},
            0.0,
            2 * nbytes(k, v) + nbytes(slots),
        )

    return Bench("write_kv", f"prefill {b}x{n} Hkv{hkv} D{d} bs{s.block}", "bfloat16", make)


def sparse_indices(qlens: list[int], kvlens: list[int], topk: int, device) -> torch.Tensor:
    """int32 [T, topk]: per query row at position pos, min(topk, pos + 1) distinct random positions <= pos,
    then -1s (the form indexer_topk returns)."""
    rows = []
    for n, length in zip(qlens, kvlens):
        pos = torch.arange(length - n, length, device=device)[:, None]
        score = torch.rand(n, length, device=device).masked_fill(
            torch.arange(length, device=device)[None, :] > pos, -1.0
        )
        top = score.topk(min(topk, length), dim=1)
        picked = torch.where(top.values >= 0, top.indices, -1)
        rows.append(torch.nn.functional.pad(picked, (0, topk - picked.shape[1]), value=-1))
    return torch.cat(rows).to(torch.int32)


def _mla_inputs(qlens: list[int], kvlens: list[int], s: Sizes, dev, heads: int = 0) -> dict:
    h, lkv, r = s.mla
    h = heads or h
    meta, nblk = paged_meta(qlens, kvlens, MLA_BLOCK, dev)
    t = sum(qlens)
    return {
        "q_nope": randn((t, h, lkv), dev),
        "q_pe": randn((t, h, r), dev),
        "ckv_cache": randn((nblk, MLA_BLOCK, lkv), dev),
        "kpe_cache": randn((nblk, MLA_BLOCK, r), dev),
        "meta": meta,
        "scale": 192**-0.5,
    }


def _mla(s: Sizes) -> list[Bench]:
    (b, length), (h, lkv, r) = s.decode, s.mla

    def attend(dev):
        inputs = _mla_inputs([1] * b, [length] * b, s, dev)
        qn, qp = inputs["q_nope"], inputs["q_pe"]
        return inputs, 2.0 * h * b * length * (2 * lkv + r), nbytes(qn, qp, qn) + b * length * (lkv + r) * 2

    def write(dev):
        t = b
        kv_c, k_pe = randn((t, lkv), dev), randn((t, r), dev)
        ckv, kpe = randn((t, MLA_BLOCK, lkv), dev), randn((t, MLA_BLOCK, r), dev)
        slots = torch.arange(t, dtype=torch.int64, device=dev) * MLA_BLOCK + (length - 1) % MLA_BLOCK
        return (
            {"kv_c": kv_c, "k_pe": k_pe, "ckv_cache": ckv, "kpe_cache": kpe, "slot_mapping": slots},
            0.0,
            2 * nbytes(kv_c, k_pe),
        )

    return [
        Bench("write_mla_kv", f"decode B{b} Lkv{lkv} R{r}", "bfloat16", write),
        Bench("mla_attention", f"decode B{b} KV{length} H{h} Lkv{lkv} R{r} bs{MLA_BLOCK}", "bfloat16", attend),
    ]


def _sparse_mla(case: str, qlens: list[int], kvlens: list[int], s: Sizes) -> Bench:
    """DSA attention: each row attends to its topk listed positions. Bytes: the distinct latent rows a
    sequence's indices can reach (min(L, rows x topk)), read once."""
    (h, lkv, r), topk = s.mla, s.indexer[2]

    def make(dev):
        inputs = _mla_inputs(qlens, kvlens, s, dev)
        idx = sparse_indices(qlens, kvlens, topk, dev)
        inputs["topk_indices"] = idx
        kept = sum(windowed(n, L, topk)[0] for n, L in zip(qlens, kvlens))
        read = sum(min(L, n * topk) for n, L in zip(qlens, kvlens))
        qn, qp = inputs["q_nope"], inputs["q_pe"]
        return inputs, 2.0 * h * kept * (2 * lkv + r), nbytes(qn, qp, qn, idx) + read * (lkv + r) * 2

    return Bench("mla_attention", case, "bfloat16", make)


def _hy4_sinks(case: str, qlens: list[int], kvlens: list[int], s: Sizes, sparse: bool) -> Bench:
    """HY4's MLA with per-head sinks (spec 1.7), dense or sparse over ``indexer``'s top-k; flops and bytes
    as for DeepSeek's MLA, plus the H sinks read."""
    (_, lkv, r), topk, h = s.mla, s.indexer[2], min(HY4_HEADS, s.mla[0])

    def make(dev):
        inputs = _mla_inputs(qlens, kvlens, s, dev, heads=h)
        inputs.update(scale=(192 + 64) ** -0.5, sinks=torch.randn(h, device=dev).add_(4.0))
        qn, qp, moved = inputs["q_nope"], inputs["q_pe"], 0.0
        if sparse:
            inputs["topk_indices"] = idx = sparse_indices(qlens, kvlens, topk, dev)
            kept = sum(windowed(n, L, topk)[0] for n, L in zip(qlens, kvlens))
            read, moved = sum(min(L, n * topk) for n, L in zip(qlens, kvlens)), nbytes(idx)
        else:
            kept, read = sum(visible(n, L) for n, L in zip(qlens, kvlens)), sum(kvlens)
        moved += nbytes(qn, qp, qn, inputs["sinks"]) + read * (lkv + r) * 2
        return inputs, 2.0 * h * kept * (2 * lkv + r), moved

    return Bench("mla_attention", case, "bfloat16", make)


def _merge(s: Sizes) -> Bench:
    hq, _, d = s.heads

    def make(dev):
        t = s.tokens
        oa, ob = randn((t, hq, d), dev), randn((t, hq, d), dev)
        la, lb = torch.randn(t, hq, device=dev), torch.randn(t, hq, device=dev)
        return {"out_a": oa, "lse_a": la, "out_b": ob, "lse_b": lb}, 0.0, nbytes(oa, ob, oa, la, lb, la)

    return Bench("merge_attention", f"T{s.tokens} H{hq} D{d}", "bfloat16", make)


def _write_index_k(s: Sizes) -> Bench:
    (b, n), d = s.prefill, s.indexer[1]

    def make(dev):
        t = b * n
        k = randn((t, d), dev)
        cache = randn((math.ceil(t / MLA_BLOCK), MLA_BLOCK, d), dev)
        slots = torch.arange(t, dtype=torch.int64, device=dev)
        return {"k": k, "index_cache": cache, "slot_mapping": slots}, 0.0, 2 * nbytes(k) + nbytes(slots)

    return Bench("write_index_k", f"prefill {b}x{n} D{d} bs{MLA_BLOCK}", "bfloat16", make)


def _indexer(case: str, qlens: list[int], kvlens: list[int], s: Sizes, ratio: int = 1) -> Bench:
    """score = sum_h w * relu(q.k) over every causal key, then the top-k: 2 Hi D flops per (row, key) and
    each sequence's keys read once. ``ratio`` m > 1 (spec 1.8, DeepSeek-V4's CSA): the keys are L // m
    compressed entries, a row at pos sees (pos + 1) // m of them, top-k a quarter of V3.2's (512)."""
    hi, d, topk = s.indexer
    topk = topk if ratio == 1 else topk // 4

    def make(dev):
        entries = [L // ratio for L in kvlens]
        meta, nblk = paged_meta(qlens, entries, MLA_BLOCK, dev)
        meta = AttentionMeta.build(qlens, kvlens, meta.block_table, device=dev)  # seq_lens count tokens
        t = sum(qlens)
        q, cache = randn((t, hi, d), dev), randn((nblk, MLA_BLOCK, d), dev)
        weights = torch.randn(t, hi, device=dev).mul_((hi * d) ** -0.5)  # the caller folds Hi^-0.5 D^-0.5 in
        seen = sum(sum((L - n + i + 1) // ratio for i in range(n)) for n, L in zip(qlens, kvlens))
        inputs = {"q": q, "weights": weights, "index_cache": cache, "meta": meta, "topk": topk}
        if ratio > 1:
            inputs["compress_ratio"] = ratio
        return inputs, (2.0 * d + 3.0) * hi * seen, nbytes(q, weights) + sum(entries) * d * 2 + t * topk * 4

    return Bench("indexer_topk", case, "bfloat16", make)


def attention_benches(s: Sizes) -> list[Bench]:
    """The attention family in spec order: decode and prefill of each op, DeepSeek-V3.2's DSA and gpt-oss's
    sliding layers included."""
    (b, length), (pb, pn), (hq, hkv, d) = s.decode, s.prefill, s.heads
    db, dl, pt, pl = s.dsa
    ohq, ohkv, od, ow = s.oss_heads
    hi, di, topk = s.indexer
    h, lkv, r = s.mla
    oss = f"gpt-oss Hq{ohq} Hkv{ohkv} D{od} window{ow} sinks"
    hy4 = f"hy4 H{min(HY4_HEADS, h)} sinks"
    return [
        _write_kv(s),
        _paged(f"decode B{b} KV{length} Hq{hq} Hkv{hkv} D{d} bs{s.block}", [1] * b, [length] * b, s, s.heads),
        _paged(f"prefill {pb}x{pn} bs{s.block}", [pn] * pb, [pn] * pb, s, s.heads),
        _paged(f"{oss} decode B{b} KV{length}", [1] * b, [length] * b, s, (ohq, ohkv, od), ow),
        _paged(f"{oss} prefill {pb}x{pn}", [pn] * pb, [pn] * pb, s, (ohq, ohkv, od), ow),
        _varlen(s),
        *_mla(s),
        _sparse_mla(f"dsa decode B{db} KV{dl} H{h} Lkv{lkv} R{r} top{topk}", [1] * db, [dl] * db, s),
        _sparse_mla(f"dsa prefill chunk {pt} of KV{pl} H{h} top{topk}", [pt], [pl], s),
        _hy4_sinks(f"{hy4} decode B{b} KV{length} Lkv{lkv} R{r}", [1] * b, [length] * b, s, False),
        _hy4_sinks(f"{hy4} dsa decode B{db} KV{dl} top{topk}", [1] * db, [dl] * db, s, True),
        _hy4_sinks(f"{hy4} dsa prefill chunk {pt} of KV{pl} top{topk}", [pt], [pl], s, True),
        _merge(s),
        _write_index_k(s),
        _indexer(f"decode B{db} KV{dl} Hi{hi} D{di} top{topk}", [1] * db, [dl] * db, s),
        _indexer(f"prefill chunk {pt} of KV{pl} Hi{hi} D{di} top{topk}", [pt], [pl], s),
        _indexer(f"deepseek-v4 csa m4 decode B{db} KV{dl} Hi{hi} D{di} top{topk // 4}", [1] * db, [dl] * db, s, 4),
        _indexer(f"deepseek-v4 csa m4 prefill chunk {pt} of KV{pl} top{topk // 4}", [pt], [pl], s, 4),
    ]
