"""The shared pieces of the byte and flop model (``hetero.bench.model``): the record and the counting helpers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Work", "attention_pairs", "nbytes", "elem_size", "lens", "meta_bytes", "cache_write"]


@dataclass(frozen=True)
class Work:
    """What one call of an op must do: ``flops`` and ``bytes`` moved to or from memory."""

    flops: float
    bytes: float


def nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def elem_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def attention_pairs(
    q_lens: list[int], kv_lens: list[int], causal: bool = True, window: tuple[int, int] = (-1, -1)
) -> tuple[int, int]:
    """(visible (query, key) pairs, KV positions some query sees) summed over the sequences.

    Query row i of a sequence with n rows and L keys sits at position L - n + i.
    """
    pairs = union = 0
    for n, length in zip(q_lens, kv_lens):
        if n == 0 or length == 0:
            continue
        pos = torch.arange(n, dtype=torch.int64) + (length - n)
        hi = pos.clamp(max=length - 1) if causal else torch.full_like(pos, length - 1)
        if window[1] >= 0:
            hi = torch.minimum(hi, pos + window[1])
        lo = (pos - window[0]).clamp(min=0) if window[0] >= 0 else torch.zeros_like(pos)
        count = (hi - lo + 1).clamp(min=0)
        seen = count > 0
        pairs += int(count.sum())
        if bool(seen.any()):
            union += int(hi[seen].max() - lo[seen].min() + 1)
    return pairs, union


def lens(offsets: torch.Tensor) -> list[int]:
    cu = offsets.tolist()
    return [b - a for a, b in zip(cu, cu[1:])]


def meta_bytes(meta: Any) -> int:
    return nbytes(meta.query_start_loc) + nbytes(meta.seq_lens) + nbytes(meta.block_table)


def cache_write(rows: torch.Tensor, *pieces: torch.Tensor) -> Work:
    valid = int((rows >= 0).sum())
    per_row = sum(p[0].numel() * p.element_size() for p in pieces if p.shape[0])
    return Work(0.0, 2 * valid * per_row + nbytes(rows))  # read each valid row, write it into the cache
