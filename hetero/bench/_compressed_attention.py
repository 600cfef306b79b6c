"""compressed_attention (spec 1.8) for ``hetero bench``: its byte and flop model (``hetero.bench.model``) and
its performance cases (``hetero.bench.perf``).

Work: per query row, its raw window (at most W rows, ``attention_pairs`` with window (W - 1, -1)) and its
compressed entries (every closed one for HCA, the listed closed ones for CSA), each a key and its own
value: 4 D flops per (row, key, head). Bytes: the query, each sequence's raw rows some row sees and its
compressed entries some row reads (listed ones for CSA) once, the output (and lse), the sinks, the
metadata, the compressed block table and the top-k list.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from hetero.bench._work import Work, attention_pairs, lens, meta_bytes, nbytes
from hetero.verify.inputs import compressed_attention as _ca

__all__ = ["compressed_attention_work", "compressed_attention_cases"]


def _compressed_pairs(a: Mapping[str, Any], q_lens: list[int], kv_lens: list[int]) -> tuple[int, int]:
    """(visible (row, entry) pairs, distinct entries read) over the batch."""
    m, idx = int(a["ratio"]), a["topk_indices"]
    pairs = union = at = 0
    for n, length in zip(q_lens, kv_lens):
        pos = torch.arange(length - n, length, dtype=torch.int64)
        closed = (pos + 1).div(m, rounding_mode="floor")
        if idx is None:
            pairs += int(closed.sum())
            union += int(closed.max()) if n else 0
        else:
            rows = idx[at : at + n].to("cpu", torch.int64)
            seen = (rows >= 0) & (rows < closed[:, None])
            pairs += int(seen.sum())
            union += int(rows[seen].unique().numel())
        at += n
    return pairs, union


def compressed_attention_work(a: Mapping[str, Any]) -> Work:
    """The Work of one compressed_attention call on its arguments by name (host metadata read once)."""
    q, meta, w = a["query"], a["meta"], int(a["window"])
    t, h, d = q.shape
    q_lens, kv_lens = lens(meta.query_start_loc), meta.seq_lens.tolist()
    raw_pairs, raw_rows = attention_pairs(q_lens, kv_lens, True, (w - 1, -1))
    comp_pairs, entries = _compressed_pairs(a, q_lens, kv_lens)
    elt = q.element_size()
    out = t * h * d * elt + (t * h * 4 if a["return_lse"] else 0)
    index = meta_bytes(meta) + nbytes(a["comp_block_table"]) + nbytes(a["topk_indices"]) + nbytes(a["sinks"])
    moved = nbytes(q) + (raw_rows + entries) * d * elt + out + index
    return Work(4.0 * d * h * (raw_pairs + comp_pairs), moved)


def compressed_attention_cases(add: Callable[..., None], full: bool, dt: str) -> None:
    """DeepSeek-V4-Flash's attention (64 heads): HCA and CSA (top 512) at a decode batch (64 at 4k context;
    quick: 4 at 1k) and a prefill chunk (4k rows after 4k tokens; quick: 128 after 384)."""
    m, bs = _ca.V4_FLASH, 64
    b, ctx = (64, 4096) if full else (4, 1024)
    rows, past = (4096, 4096) if full else (128, 384)
    for name, ratio, k, bsc in (("hca", _ca.HCA, 0, 2), ("csa", _ca.CSA, 512, 64)):
        tag = f"deepseek-v4-flash-{name}" + (f"-k{k}" if k else "")
        shapes = ((f"decode-b{b}-ctx{ctx}", [(1, ctx)] * b), (f"chunk{rows}-of-{past + rows}", [(rows, past + rows)]))
        for shape, seqs in shapes:
            build = _ca.compressed_attention(m, ratio, seqs, bs=bs, bsc=bsc, topk=k, lse=False)
            add("compressed_attention", f"{tag}-{shape}", build, _ca.static(dt, m, ratio, bs, bsc, topk=k, lse=False))
