"""The AttentionMeta checks: its layout (types, dtypes, shapes: no host read) and its values
against the token count and the cache (on one host copy of each tensor)."""

from __future__ import annotations

import numbers

import torch

from hetero.errors import OpError
from hetero.spec._checks_core import INDEX_DTYPES, _first, check_cu_seqlens, check_tensor
from hetero.spec.types import AttentionMeta

__all__ = ["check_meta_shapes", "check_meta"]


def _int(x: object) -> bool:
    # int first: a symbolic int under torch.compile is an int without being pinned to its value
    return (isinstance(x, int) or isinstance(x, numbers.Integral)) and not isinstance(x, bool)


def check_meta_shapes(op: str, meta: object, num_tokens: int) -> AttentionMeta:
    """Types, ranks, dtypes and sizes of the metadata, no values read (no host sync)."""
    if not isinstance(meta, AttentionMeta):
        raise OpError(op, "meta", "an AttentionMeta", type(meta).__name__)
    check_tensor(op, "meta.seq_lens", meta.seq_lens, ndim=1, dtypes=INDEX_DTYPES)
    batch = meta.seq_lens.shape[0]
    check_tensor(op, "meta.query_start_loc", meta.query_start_loc, shape=(batch + 1,), dtypes=INDEX_DTYPES)
    check_tensor(op, "meta.block_table", meta.block_table, ndim=2, dtypes=INDEX_DTYPES)
    # messages are built only on failure: formatting a size would pin it under torch.compile
    if meta.block_table.shape[0] != batch:
        raise OpError(op, "meta.block_table", f"{batch} rows (one per sequence)", str(meta.block_table.shape[0]))
    for arg in ("max_query_len", "max_seq_len"):
        value = getattr(meta, arg)
        if not (_int(value) and value >= 0):
            raise OpError(op, f"meta.{arg}", "an int >= 0", repr(value))
    if batch == 0 and num_tokens != 0:
        raise OpError(op, "meta.seq_lens", f"at least one sequence for {num_tokens} tokens", "none")
    return meta


def check_meta(
    op: str, meta: AttentionMeta, num_tokens: int, num_blocks: int, block_size: int, ratio: int = 1
) -> tuple[list[int], list[int]]:
    """Validate AttentionMeta against T tokens and a cache of NB blocks of BS slots, in whole-tensor
    operations on one host copy of each tensor. Returns host lists (query_start_loc, seq_lens).
    ``ratio`` m > 1: the cache holds compressed entries, ``seq_lens[b] // m`` of sequence b (spec 1.8)."""
    batch = check_meta_shapes(op, meta, num_tokens).seq_lens.shape[0]
    qsl = check_cu_seqlens(op, "meta.query_start_loc", meta.query_start_loc, num_tokens, batch)
    seq = meta.seq_lens.to("cpu", torch.int64)
    qlen = torch.tensor(qsl[1:], dtype=torch.int64) - torch.tensor(qsl[:-1], dtype=torch.int64)
    b = _first(seq < qlen)
    if b is not None:
        raise OpError(op, "meta.seq_lens", f"seq_lens[{b}] >= its query length {int(qlen[b])}", str(int(seq[b])))
    entries = seq.div(ratio, rounding_mode="floor")
    used = (entries + block_size - 1).div(block_size, rounding_mode="floor")
    cols = meta.block_table.shape[1]
    b = _first(used > cols)
    if b is not None:
        raise OpError(
            op,
            "meta.block_table",
            f"at least {int(used[b])} columns for seq_lens[{b}]={int(seq[b])} with block size {block_size}"
            + (f" and compress ratio {ratio} ({int(entries[b])} entries)" if ratio > 1 else ""),
            str(cols),
        )
    table = meta.block_table.to("cpu", torch.int64)
    in_use = torch.arange(cols)[None, :] < used[:, None]
    bad = _first(in_use & ((table < 0) | (table >= num_blocks)))
    if bad is not None:
        row, col = divmod(bad, cols)
        raise OpError(
            op, "meta.block_table", f"block ids in [0, {num_blocks})", f"{int(table[row, col])} at [{row}, {col}]"
        )
    for arg, value, need, what in (
        ("max_query_len", meta.max_query_len, qlen, "query"),
        ("max_seq_len", meta.max_seq_len, seq, "sequence"),
    ):
        longest = int(need.max()) if batch else 0
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= longest
        if not ok:
            raise OpError(op, f"meta.{arg}", f"an int at least the longest {what} ({longest})", repr(value))
    return qsl, seq.tolist()
