"""The core the reference attention ops share: the visibility mask, one sequence's masked softmax,
the loop over a batch's sequences, and the paged cache's gather and scatter.

Accumulation is in the dtype the caller gives (float32, or float64 for the oracle run); a row
that sees no key gets out 0 and lse -inf.
"""

from __future__ import annotations

from typing import Callable

import torch

from hetero.spec.types import AttentionMeta
from hetero_cpu_ref._util import acc_dtype

__all__ = ["NEG_INF", "visible", "attend", "attend_all", "gather", "scatter", "used_blocks"]

NEG_INF = float("-inf")


def visible(n: int, length: int, causal: bool, window: tuple[int, int], device: torch.device) -> torch.Tensor:
    """bool [n, L]: key j visible to query row i, which sits at position L - n + i."""
    pos = torch.arange(n, device=device)[:, None] + (length - n)
    j = torch.arange(length, device=device)[None, :]
    mask = torch.ones(n, length, dtype=torch.bool, device=device)
    if causal:
        mask &= j <= pos
    if window[0] >= 0:
        mask &= j >= pos - window[0]
    if window[1] >= 0:
        mask &= j <= pos + window[1]
    return mask


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    causal: bool,
    window: tuple[int, int],
    softcap: float,
    sinks: torch.Tensor | None,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence: q [n, Hq, D], k [L, Hkv, D], v [L, Hkv, Dv], all in the accumulation dtype.

    ``mask`` bool [n, L], when given, is the visibility instead of causal and window (sparse MLA).

    Returns out [n, Hq, Dv] and lse [n, Hq]; a row with no visible key gets 0 and -inf.
    """
    n, hq, d = q.shape
    length, hkv, dv = k.shape[0], k.shape[1], v.shape[2]
    g = hq // hkv  # query head h reads KV head h // g
    s = torch.einsum("nkgd,lkd->kgnl", q.reshape(n, hkv, g, d), k).reshape(hq, n, length) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    seen = visible(n, length, causal, window, q.device) if mask is None else mask
    s = s.masked_fill(~seen, NEG_INF)
    lse = torch.logsumexp(s, dim=-1)  # [Hq, n], -inf for a row with no visible key
    denom = lse if sinks is None else torch.logaddexp(lse, sinks.to(lse.dtype)[:, None])
    denom = denom.masked_fill(denom == NEG_INF, 0.0)  # empty row: exp(-inf - 0) = 0, not NaN
    p = torch.exp(s - denom[..., None])
    out = torch.einsum("kgnl,lkd->nkgd", p.reshape(hkv, g, n, length), v).reshape(n, hq, dv)
    return out, lse.transpose(0, 1)


def attend_all(
    query: torch.Tensor,
    starts: list[int],
    kv_of: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    out: torch.Tensor,
    mask_of: Callable[[int], torch.Tensor] | None = None,
    **opts,
) -> torch.Tensor:
    """Attend each sequence's rows [starts[b], starts[b+1]) of query to kv_of(b), writing into out.

    Every row belongs to one sequence (starts runs from 0 to T), so out is fully
    written. ``mask_of(b)``, when given, is sequence b's visibility (see ``attend``).
    Returns lse float32 [T, Hq].
    """
    acc = acc_dtype(query)
    lse = torch.empty(query.shape[:2], dtype=torch.float32, device=query.device)
    for b in range(len(starts) - 1):
        a, e = starts[b], starts[b + 1]
        if a == e:
            continue
        k, v = kv_of(b)
        mask = None if mask_of is None else mask_of(b)
        o, seq_lse = attend(query[a:e].to(acc), k.to(acc), v.to(acc), mask=mask, **opts)
        out[a:e] = o
        lse[a:e] = seq_lse
    return lse


def gather(cache: torch.Tensor, blocks: list[int], length: int) -> torch.Tensor:
    """The first `length` positions of a sequence from a paged cache [NB, BS, ...] -> [length, ...]."""
    ids = torch.tensor(blocks, dtype=torch.long, device=cache.device)
    return cache.index_select(0, ids).flatten(0, 1)[:length]


def scatter(dst: torch.Tensor, src: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """dst[slot // BS, slot % BS] = src[t] for every token t whose slot is not -1 (in place)."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    bs = dst.shape[1]
    dst[slots // bs, slots % bs] = src[keep].to(dst.dtype)


def used_blocks(meta: AttentionMeta, seq_lens: list[int], block_size: int) -> list[list[int]]:
    """Per sequence, the block ids that hold its seq_lens[b] keys (check_meta has checked them)."""
    used = -(-max(seq_lens, default=0) // block_size)
    table = meta.block_table[:, :used].tolist()  # a persistent table is as wide as max_model_len allows
    return [row[: -(-length // block_size)] for row, length in zip(table, seq_lens)]
