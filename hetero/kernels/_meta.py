"""AttentionMeta for the Triton launchers: the cheap checks (no values read) and, for the row-wise
DSA kernels, each query row's (sequence, position), computed on the device without a host sync."""
from __future__ import annotations

import numbers

import torch

from hetero.spec.checks import INDEX_DTYPES, check_tensor, expect
from hetero.spec.types import AttentionMeta

__all__ = ["check_meta_shapes", "row_positions"]


def _int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def check_meta_shapes(op: str, meta: object, num_tokens: int) -> AttentionMeta:
    """Ranks, dtypes and sizes of the metadata (no values: that would need a host sync)."""
    expect(isinstance(meta, AttentionMeta), op, "meta", "an AttentionMeta", type(meta).__name__)
    assert isinstance(meta, AttentionMeta)
    check_tensor(op, "meta.seq_lens", meta.seq_lens, ndim=1, dtypes=INDEX_DTYPES)
    batch = meta.seq_lens.shape[0]
    check_tensor(op, "meta.query_start_loc", meta.query_start_loc, shape=(batch + 1,), dtypes=INDEX_DTYPES)
    check_tensor(op, "meta.block_table", meta.block_table, ndim=2, dtypes=INDEX_DTYPES)
    expect(meta.block_table.shape[0] == batch, op, "meta.block_table", f"{batch} rows (one per sequence)", meta.block_table.shape[0])
    expect(_int(meta.max_query_len) and meta.max_query_len >= 0, op, "meta.max_query_len", "an int >= 0", repr(meta.max_query_len))
    expect(batch > 0 or num_tokens == 0, op, "meta.seq_lens", f"at least one sequence for {num_tokens} tokens", "none")
    return meta


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
