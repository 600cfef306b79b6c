"""The AttentionMeta checks: its layout (types, dtypes, shapes: no host read) and its values
against the token count and the cache (on one host copy of each tensor)."""
from __future__ import annotations

import numbers

import torch

from hetero.spec.checks import INDEX_DTYPES, _first, check_cu_seqlens, check_tensor, expect
from hetero.spec.types import AttentionMeta

__all__ = ["check_meta_shapes", "check_meta"]


def _int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def check_meta_shapes(op: str, meta: object, num_tokens: int) -> AttentionMeta:
    """Types, ranks, dtypes and sizes of the metadata, no values read (no host sync)."""
    expect(isinstance(meta, AttentionMeta), op, "meta", "an AttentionMeta", type(meta).__name__)
    assert isinstance(meta, AttentionMeta)
    check_tensor(op, "meta.seq_lens", meta.seq_lens, ndim=1, dtypes=INDEX_DTYPES)
    batch = meta.seq_lens.shape[0]
    check_tensor(op, "meta.query_start_loc", meta.query_start_loc, shape=(batch + 1,), dtypes=INDEX_DTYPES)
    check_tensor(op, "meta.block_table", meta.block_table, ndim=2, dtypes=INDEX_DTYPES)
    expect(meta.block_table.shape[0] == batch, op, "meta.block_table", f"{batch} rows (one per sequence)", meta.block_table.shape[0])
    for arg in ("max_query_len", "max_seq_len"):
        value = getattr(meta, arg)
        expect(_int(value) and value >= 0, op, f"meta.{arg}", "an int >= 0", repr(value))
    expect(batch > 0 or num_tokens == 0, op, "meta.seq_lens", f"at least one sequence for {num_tokens} tokens", "none")
    return meta


def check_meta(op: str, meta: AttentionMeta, num_tokens: int, num_blocks: int, block_size: int) -> tuple[list[int], list[int]]:
    """Validate AttentionMeta against T tokens and a cache of NB blocks of BS slots, in whole-tensor
    operations on one host copy of each tensor. Returns host lists (query_start_loc, seq_lens)."""
    batch = check_meta_shapes(op, meta, num_tokens).seq_lens.shape[0]
    qsl = check_cu_seqlens(op, "meta.query_start_loc", meta.query_start_loc, num_tokens, batch)
    seq = meta.seq_lens.to("cpu", torch.int64)
    qlen = torch.tensor(qsl[1:], dtype=torch.int64) - torch.tensor(qsl[:-1], dtype=torch.int64)
    b = _first(seq < qlen)
    expect(b is None, op, "meta.seq_lens", f"seq_lens[{b}] >= its query length {int(qlen[b]) if b is not None else 0}", int(seq[b]) if b is not None else "")
    used = (seq + block_size - 1).div(block_size, rounding_mode="floor")
    cols = meta.block_table.shape[1]
    b = _first(used > cols)
    expect(b is None, op, "meta.block_table", f"at least {int(used[b]) if b is not None else 0} columns for seq_lens[{b}]="
           f"{int(seq[b]) if b is not None else 0} with block size {block_size}", cols)
    table = meta.block_table.to("cpu", torch.int64)
    in_use = torch.arange(cols)[None, :] < used[:, None]
    bad = _first(in_use & ((table < 0) | (table >= num_blocks)))
    if bad is not None:
        row, col = divmod(bad, cols)
        expect(False, op, "meta.block_table", f"block ids in [0, {num_blocks})", f"{int(table[row, col])} at [{row}, {col}]")
    for arg, value, need, what in (("max_query_len", meta.max_query_len, qlen, "query"), ("max_seq_len", meta.max_seq_len, seq, "sequence")):
        longest = int(need.max()) if batch else 0
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= longest
        expect(ok, op, f"meta.{arg}", f"an int at least the longest {what} ({longest})", repr(value))
    return qsl, seq.tolist()
