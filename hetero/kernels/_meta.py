"""AttentionMeta for the row-wise DSA kernels: each query row's (sequence, position), computed on the
device without a host sync (the metadata's cheap checks are ``hetero.spec._checks_meta``)."""

from __future__ import annotations

import torch

from hetero.spec.types import AttentionMeta

__all__ = ["row_positions"]


def row_positions(meta: AttentionMeta, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequence int64 [T] in [0, B), position int64 [T]) of every query row: row i of sequence b
    sits at ``seq_lens[b] - n_b + i``. Device-side torch ops; a row no sequence owns (malformed
    query_start_loc) gets position -1, which sees no key. The kernels still clamp both."""
    cu = meta.query_start_loc.to(torch.int64)
    batch = meta.seq_lens.shape[0]
    rows = torch.arange(num_tokens, device=cu.device, dtype=torch.int64)
    seq = torch.searchsorted(cu[1:].contiguous(), rows, right=True).clamp_(max=batch - 1)
    start, end = cu[seq], cu[seq + 1]
    pos = meta.seq_lens.to(torch.int64)[seq] - (end - start) + (rows - start)
    pos = torch.where((rows >= start) & (rows < end), pos, -1)
    return seq, pos
