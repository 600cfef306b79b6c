"""Planted bugs of compressed_attention (spec 1.8) in a compact, independent implementation: row by row,
raw rows and compressed entries read one slot at a time through their block tables, one softmax over
both. Its bug-free form must pass every quick case (``make_control``), which shows each planted bug
is the only difference. Every bug stays inside the tensors (an entry the sequence does not hold is
never read), so the suite catches wrong numbers, not faults.
``broken_backends.BUGS`` includes ``BUGS`` from here.
"""

from __future__ import annotations

import torch
from _one_op import one_op_plugin

__all__ = ["BUGS", "mini_compressed_attention", "make_control"]

_NEG_INF = float("-inf")


def _rows(meta):
    """(row index, sequence, its length, the row's position) for every query row."""
    qsl, lens = meta.query_start_loc.tolist(), meta.seq_lens.tolist()
    for b, length in enumerate(lens):
        n = qsl[b + 1] - qsl[b]
        for i in range(n):
            yield qsl[b] + i, b, length, length - n + i


def _closed(pos: int, ratio: int, bug: str | None) -> int:
    """How many compressed entries the row sees: (pos + 1) // m, or one of the bugs' rules."""
    if bug == "compressed_causal_off_by_one":  # w <= (pos + 1) // m
        return (pos + 1) // ratio + 1
    if bug == "compressed_open_window_visible":  # w < pos // m + 1: the window being filled counts
        return pos // ratio + 1
    if bug == "compressed_window_closes_late":  # w < pos // m: the window that closes at pos does not
        return pos // ratio
    return (pos + 1) // ratio


def _entries(topk_row: list[int] | None, closed: int, bug: str | None) -> list[int]:
    """The entries a row attends to, in order (all closed ones for HCA)."""
    if topk_row is None or bug == "compressed_topk_ignored":
        return list(range(closed))
    if bug == "compressed_topk_padding_reads_entry_0":
        topk_row = [max(w, 0) for w in topk_row]  # -1 clamped instead of skipped
    return [w for w in topk_row if 0 <= w < closed]


def mini_compressed_attention(bug: str | None):
    """compressed_attention; ``bug`` names its one mistake (None: correct)."""

    def compressed_attention(
        query,
        kv_cache,
        comp_cache,
        meta,
        comp_block_table,
        *,
        scale,
        window,
        ratio,
        sinks=None,
        topk_indices=None,
        return_lse=False,
    ):
        acc = torch.float64 if query.dtype == torch.float64 else torch.float32
        t, h, d = query.shape
        bs, (nbc, bsc) = kv_cache.shape[1], comp_cache.shape[:2]
        table, ctable = meta.block_table.tolist(), comp_block_table.tolist()
        idx = None if topk_indices is None else topk_indices.tolist()
        out = torch.zeros(t, h, d, dtype=acc)
        lse = torch.full((t, h), _NEG_INF, dtype=acc)
        for r, b, length, pos in _rows(meta):
            first = pos - window + 1
            first += {"compressed_window_one_too_wide": -1, "compressed_window_one_too_narrow": 1}.get(bug, 0)
            keys = [kv_cache[table[b][j // bs], j % bs] for j in range(max(first, 0), pos + 1)]
            closed = min(_closed(pos, ratio, bug), length // ratio)  # never an entry the sequence lacks
            for w in _entries(None if idx is None else idx[r], closed, bug):
                blk = min(w // bsc, nbc - 1) if bug == "compressed_comp_block_table_ignored" else ctable[b][w // bsc]
                keys.append(comp_cache[blk, w % bsc])
            kv = torch.stack(keys).to(acc)  # [keys, D]: the keys are the values
            s = scale * (query[r].to(acc) @ kv.T)  # [H, keys]
            lse[r] = torch.logsumexp(s, dim=1)
            sink = None if sinks is None or bug == "compressed_sinks_ignored" else sinks.to(acc)
            denom = lse[r] if sink is None else torch.logaddexp(lse[r], sink)
            out[r] = torch.exp(s - denom[:, None]) @ kv
            if sink is not None and bug == "compressed_sink_adds_a_value":  # the sink as a key valued like key 0
                out[r] += torch.exp(sink - denom)[:, None] * kv[0]
            if bug == "compressed_lse_includes_sinks":
                lse[r] = denom
        res = out.to(query.dtype)
        return (res, lse.to(torch.float32)) if return_lse else res

    return staticmethod(compressed_attention)


_BUG_NAMES = (
    # the compressed causal rule w < (pos + 1) // m, off by one each way
    "compressed_causal_off_by_one",
    "compressed_open_window_visible",
    "compressed_window_closes_late",
    # the sliding window of W raw rows, the row's own included
    "compressed_window_one_too_wide",
    "compressed_window_one_too_narrow",
    # the sinks: dropped, given a value, counted in lse
    "compressed_sinks_ignored",
    "compressed_sink_adds_a_value",
    "compressed_lse_includes_sinks",
    # CSA's top-k list: -1 read as entry 0, the list ignored (every closed entry: HCA)
    "compressed_topk_padding_reads_entry_0",
    "compressed_topk_ignored",
    # the compressed cache read as if its blocks were in order
    "compressed_comp_block_table_ignored",
)

#: bug name -> (the op it breaks, its implementation)
BUGS = {bug: ("compressed_attention", mini_compressed_attention(bug)) for bug in _BUG_NAMES}


def make_control(op: str = "compressed_attention"):
    """A plugin providing backend ``control_compressed_attention``: the reference with the bug-free mini op."""
    return one_op_plugin(f"control_{op}", op, mini_compressed_attention(None))
