"""paged_attention over a decode batch (one query row per sequence) without reading the metadata on
the host: B sequences are one padded group of ``meta.max_seq_len`` keys, so the step plan and its
host copy of the lengths are not needed. The metadata's values are checked by the registry when
validation is on; unchecked, the key slots are clamped into the cache (``key_slots``), so a
malformed call gives undefined results but reads nothing outside its tensors."""

from __future__ import annotations

import torch

from hetero.errors import OpError
from hetero.spec.types import AttentionMeta
from hetero_torch._attention_core import acc_dtype, attend, sdpa
from hetero_torch._attention_plan import gather_slots, key_slots

__all__ = ["is_decode", "decode"]


def is_decode(meta: AttentionMeta, num_tokens: int) -> bool:
    """Whether every sequence has exactly one query row (from the host ints and shapes alone)."""
    return num_tokens > 0 and meta.max_query_len == 1 and meta.num_seqs == num_tokens


def _mask(lens: torch.Tensor, length: int, window: tuple[int, int]) -> torch.Tensor:
    """bool [B, 1, L]: the keys each sequence's query row (at position lens - 1) sees."""
    j = torch.arange(length, device=lens.device)[None, :]
    mask = j < lens[:, None]
    if window[0] >= 0:
        mask = mask & (j >= (lens - 1 - window[0])[:, None])
    return mask[:, None]


def decode(
    op: str,
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMeta,
    res: torch.Tensor,
    *,
    scale: float,
    window: tuple[int, int],
    softcap: float,
    sinks: torch.Tensor | None,
    return_lse: bool,
):
    """The op's result for a decode batch, written into res [B, Hq, Dv] (and lse float32 [B, Hq])."""
    nb, bs = k_cache.shape[:2]
    # no int() or message built from the length: under torch.compile it stays a symbolic size
    length = meta.max_seq_len if meta.max_seq_len >= 1 else 1
    cols = meta.block_table.shape[1]
    if cols * bs < length:
        raise OpError(
            op,
            "meta.block_table",
            f"at least {-(-length // bs)} columns for max_seq_len {length} with block size {bs}",
            str(cols),
        )
    lens = meta.seq_lens.to(torch.int64).clamp(1, length)
    slots = key_slots(meta.block_table, None, lens, length, nb, bs)
    k, v = gather_slots(k_cache, slots), gather_slots(v_cache, slots)
    q, mask = query[:, None], _mask(lens, length, window)
    if softcap == 0 and sinks is None and not return_lse:
        res.copy_(sdpa(q, k, v, mask, scale=scale)[:, 0])
        return res
    acc = acc_dtype(query, sinks)
    o, lse = attend(q.to(acc), k.to(acc), v.to(acc), mask, scale=scale, softcap=softcap, sinks=sinks)
    res.copy_(o[:, 0])
    return (res, lse[:, 0].to(torch.float32)) if return_lse else res
