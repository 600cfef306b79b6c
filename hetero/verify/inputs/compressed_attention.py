"""Inputs of the cases of compressed_attention (spec 1.8): DeepSeek-V4's attention over a sliding window
of one shared K=V head plus compressed entries.

DeepSeek-V4 (transformers ``models/deepseek_v4``, ``DeepseekV4Attention``): head_dim 512 for queries,
keys and values alike, one K=V head, a sliding window of 128 raw rows, softmax scale 512 ** -0.5 and one
learned sink per head; V4-Flash has 64 query heads (32 per rank under 2-way tensor parallelism, which
splits the sinks with the heads), V4-Pro 128. Its HCA layers attend to every compressed entry (m = 128),
its CSA layers to the indexer's top 512 of the m = 4 entries. Queries, raw rows and entries are drawn
standard normal (the model RMS-normalizes them), so the logits are of order 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hetero.verify.inputs.draw import randn, uniform
from hetero.verify.inputs.paged import Seqs, blocks, meta

__all__ = ["V4Attention", "V4_FLASH", "V4_FLASH_TP2", "V4_PRO", "HCA", "CSA", "compressed_attention", "static"]


@dataclass(frozen=True)
class V4Attention:
    """One rank's share of a DeepSeek-V4 attention layer: H query heads over one K=V head of D."""

    heads: int
    d: int = 512
    window: int = 128

    @property
    def scale(self) -> float:
        return self.d**-0.5


V4_FLASH, V4_FLASH_TP2, V4_PRO = V4Attention(64), V4Attention(32), V4Attention(128)
#: compress ratios: HCA pools 128 tokens per entry and attends to all of them, CSA 4 and a top-k list
HCA, CSA = 128, 4


def _sinks(gen: torch.Generator, h: int, sinks: bool | float) -> torch.Tensor:
    """float32 [H]. True: uniform in [2, 9], around the lse of 128..640 keys, so the sink takes a real
    share of each row's softmax; a float M: +M and -M on alternate heads (a sink that swamps every
    key, and one that is nothing)."""
    if sinks is True:
        return uniform(gen, (h,), 2.0, 9.0)
    return float(sinks) * (1.0 - 2.0 * (torch.arange(h) % 2)).to(torch.float32)


def topk_rows(gen: torch.Generator, seqs: Seqs, ratio: int, k: int, *, beyond: int = 0) -> torch.Tensor:
    """topk_indices int32 [T, K] as indexer_topk(compress_ratio=m) leaves them: per row at position pos,
    min(K, (pos + 1) // m) distinct entries of those whose window has closed, in random order, then
    -1s. ``beyond``: that many of a row's last slots (padding or not) replaced by entries the row
    cannot see (the next one to close when the sequence holds it, one far past the cache, negative),
    which must be skipped."""
    rows = []
    for n, length in seqs:
        for i in range(n):
            pos = length - n + i
            closed = (pos + 1) // ratio
            row = torch.full((k,), -1, dtype=torch.int64)
            keep = min(k, closed)
            row[:keep] = torch.randperm(max(closed, 1), generator=gen)[:keep]
            if beyond:
                bad = [closed] if closed < length // ratio else []
                bad = torch.tensor(bad + [1 << 30, -2, -(1 << 20)], dtype=torch.int64)[:beyond]
                row[k - len(bad) :] = bad
            rows.append(row[torch.randperm(k, generator=gen)])
    out = torch.stack(rows) if rows else torch.empty(0, k, dtype=torch.int64)
    return out.to(torch.int32)


def compressed_attention(
    m: V4Attention,
    ratio: int,
    seqs: Seqs,
    *,
    bs: int = 64,
    bsc: int = 1,
    topk: int = 0,
    beyond: int = 0,
    sinks: bool | float = True,
    lse: bool = True,
):
    """compressed_attention over sequences ``seqs`` (query rows, tokens): HCA (``topk`` 0) or CSA with
    ``topk`` entries per row (``beyond`` as in ``topk_rows``); raw rows in a paged cache of block ``bs``,
    each sequence's ``L // ratio`` entries in one of block ``bsc``, both in shuffled blocks."""

    def build(gen: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        nb, table = blocks(gen, [L for _, L in seqs], bs)
        nbc, comp_table = blocks(gen, [L // ratio for _, L in seqs], bsc)
        t = sum(n for n, _ in seqs)
        args: dict[str, Any] = {
            "query": randn(gen, (t, m.heads, m.d), dtype),
            "kv_cache": randn(gen, (nb, bs, m.d), dtype),
            "comp_cache": randn(gen, (nbc, bsc, m.d), dtype),
            "meta": meta(seqs, table),
            "comp_block_table": torch.tensor(comp_table, dtype=torch.int32).reshape(len(seqs), -1),
            "scale": m.scale,
            "window": m.window,
            "ratio": ratio,
            "sinks": _sinks(gen, m.heads, sinks),
            "return_lse": lse,
        }
        if topk:
            args["topk_indices"] = topk_rows(gen, seqs, ratio, topk, beyond=beyond)
        return args

    return build


def static(dt: str, m: V4Attention, ratio: int, bs: int, bsc: int, *, topk: int = 0, lse: bool = True) -> dict:
    """What an engine passes to ``supports`` for this configuration."""
    return {
        "dtype": dt,
        "head_dim": m.d,
        "num_heads": m.heads,
        "block_size": bs,
        "comp_block_size": bsc,
        "window": m.window,
        "ratio": ratio,
        "sinks": True,
        **({"topk_indices": True, "topk": topk} if topk else {}),
        **({"return_lse": True} if lse else {}),
    }
