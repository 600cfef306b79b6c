"""The byte and flop model of kv_compress (spec 1.8), for ``hetero.bench.model``.

Bytes: the rows of this call of every sequence with a slot (kv and gate), the ring half-rows its
closing windows read (the slots of tokens before ``start``), the ring rows it writes (the last
``min(n, R)`` of both tensors), one entry of D per closing window, position_bias, norm_weight, the
cos/sin row and block id of each entry, and the index tensors. Flops: per (slot, channel) of each closing window
the logit's add, the max, the exp, the sum and the weighted sum's multiply-add (6); per entry the
norm (4 per channel) and the rope (6 per rotated pair).
"""

from __future__ import annotations

from typing import Any, Mapping

from hetero.bench._work import Work, nbytes

__all__ = ["kv_compress_work"]


def kv_compress_work(a: Mapping[str, Any]) -> Work:
    """The Work of one kv_compress call on its arguments by name (host metadata read once)."""
    kv, meta, m = a["kv"], a["meta"], int(a["ratio"])
    c = 2 if a["overlap"] else 1
    width = kv.shape[1]
    d, r, rot = width // c, c * m, a["cos_sin_cache"].shape[1]
    qsl, lens, slots = meta.query_start_loc.tolist(), meta.seq_lens.tolist(), a["state_slots"].tolist()
    entries = ring_read = ring_written = rows = 0
    for b, p in enumerate(slots):
        if p < 0:
            continue
        n, length = qsl[b + 1] - qsl[b], lens[b]
        start = length - n
        rows += n
        ring_written += min(n, r)
        for w in range(start // m, length // m):
            entries += 1
            first = (w - c + 1) * m
            ring_read += max(0, min(start, first + r) - max(0, first))
    elt = kv.element_size()
    moved = (2 * rows * width + 2 * ring_read * d + 2 * ring_written * width + entries * d) * elt
    moved += nbytes(a["position_bias"]) + nbytes(a["norm_weight"]) + entries * rot * a["cos_sin_cache"].element_size()
    moved += nbytes(meta.query_start_loc) + nbytes(meta.seq_lens) + nbytes(a["state_slots"])
    moved += entries * meta.block_table.element_size()  # each entry's block id
    flops = entries * (6.0 * r * d + 4.0 * d + 3.0 * rot)
    return Work(flops, float(moved))
