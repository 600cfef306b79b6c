"""Reference compressed_attention (spec 1.8, DeepSeek-V4): one softmax over a sliding window of raw
K=V rows and the compressed entries, with per-head sinks.

Written literally from the spec (``hetero.spec.compressed``): per sequence, its raw rows that any of
its query rows can see (the last ``n + W - 1`` tokens at most) and all its compressed entries are
gathered through the two block tables and concatenated into one key list whose values are the keys
themselves; a visibility mask [n, keys] holds the sliding-window rule ``pos - W < j <= pos`` and the
compressed rule ``w < (pos + 1) // m`` (and, for CSA, membership in the row's ``topk_indices``). The
masked softmax is ``_attend.attend``'s, which paged attention shares: sinks join its denominator,
lse excludes them, accumulation is float32 (float64 when given float64).
"""

from __future__ import annotations

import torch

from hetero.spec.checks import check_comp_block_table, check_compressed_attention, check_meta
from hetero.spec.types import AttentionMeta
from hetero_cpu_ref._attend import attend, gather, used_blocks
from hetero_cpu_ref._util import acc_dtype

__all__ = ["compressed_attention", "compressed_mask"]


def compressed_mask(n: int, length: int, entries: int, ratio: int, listed: torch.Tensor | None) -> torch.Tensor:
    """bool [n, entries]: entry w visible to row i (at position ``length - n + i``): ``w < (pos + 1) // m``,
    and, with ``listed`` (the rows' topk_indices [n, K]), named in the row's list (-1 and any other
    entry the row cannot see are skipped)."""
    pos = torch.arange(n)[:, None] + (length - n)
    w = torch.arange(entries)[None, :]
    mask = w < (pos + 1) // ratio
    if listed is None:
        return mask
    idx = listed.to("cpu", torch.int64)
    ok = (idx >= 0) & (idx < entries)
    named = torch.zeros(n, entries + 1, dtype=torch.bool)
    named.scatter_(1, torch.where(ok, idx, entries), True)  # column `entries` collects the skipped ones
    return mask & named[:, :entries]


def compressed_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    comp_cache: torch.Tensor,
    meta: AttentionMeta,
    comp_block_table: torch.Tensor,
    *,
    scale: float,
    window: int,
    ratio: int,
    sinks: torch.Tensor | None = None,
    topk_indices: torch.Tensor | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    op = "compressed_attention"
    t, h, d, nb, bs, nbc, bsc = check_compressed_attention(
        op, query, kv_cache, comp_cache, meta, comp_block_table, scale, window, ratio, sinks, topk_indices, return_lse
    )
    qsl, seq_lens = check_meta(op, meta, t, nb, bs)
    comp_blocks = check_comp_block_table(op, comp_block_table, seq_lens, ratio, nbc, bsc)
    blocks = used_blocks(meta, seq_lens, bs)
    acc = acc_dtype(query)
    out = torch.empty(t, h, d, dtype=acc, device=query.device)
    lse = torch.empty(t, h, dtype=torch.float32, device=query.device)
    for b, length in enumerate(seq_lens):
        a, e = qsl[b], qsl[b + 1]
        n = e - a
        if n == 0:
            continue
        first = max(0, length - n - window + 1)  # the oldest raw row the first query row sees
        raw = gather(kv_cache, blocks[b], length)[first:]
        entries = length // ratio
        comp = gather(comp_cache, comp_blocks[b], entries)
        keys = torch.cat([raw, comp]).to(acc)[:, None]  # one K=V head
        pos = torch.arange(n)[:, None] + (length - n)
        j = torch.arange(first, length)[None, :]
        sliding = (j <= pos) & (j > pos - window)
        listed = None if topk_indices is None else topk_indices[a:e]
        mask = torch.cat([sliding, compressed_mask(n, length, entries, ratio, listed)], dim=1)
        o, seq_lse = attend(
            query[a:e].to(acc),
            keys,
            keys,
            scale=float(scale),
            causal=False,
            window=(-1, -1),
            softcap=0.0,
            sinks=sinks,
            mask=mask.to(query.device),
        )
        out[a:e] = o
        lse[a:e] = seq_lse
    res = out.to(query.dtype)
    return (res, lse) if return_lse else res
