"""compressed_attention (spec 1.8, DeepSeek-V4) from torch's batched operators.

Semantics: ``hetero.spec.compressed``. Query rows are taken in chunks; per chunk, each row's keys are
gathered through the two block tables into one tensor [rows, W + C, D]: its last W raw rows (positions
``pos - W + 1 .. pos``) and its C compressed candidates (every entry of the longest sequence for HCA,
its ``topk_indices`` row for CSA). A key a row cannot see (before position 0, a compressed window not
yet closed, -1 padding) is masked out of the logits and zeroed, so a stale or unwritten cache slot
(NaN) never reaches the output. One masked softmax over both sources, with the sinks in its
denominator (lse excludes them), in float32 (float64 when given float64).
"""

from __future__ import annotations

import torch

from hetero.spec.checks import check_comp_block_table, check_compressed_attention, check_meta
from hetero.spec.types import AttentionMeta
from hetero_torch._layers_util import acc_dtype

__all__ = ["compressed_attention"]

#: The most gathered key elements (rows x keys x D) one chunk of rows holds.
_BUDGET = 1 << 24
_NEG_INF = float("-inf")


def _rows(qsl: list[int], seq_lens: list[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequence, position) int64 [T] of every query row."""
    seq, pos = [], []
    for b, length in enumerate(seq_lens):
        n = qsl[b + 1] - qsl[b]
        seq += [b] * n
        pos += range(length - n, length)
    as_t = lambda v: torch.tensor(v, dtype=torch.int64, device=device)  # noqa: E731
    return as_t(seq), as_t(pos)


def _slots(table: torch.Tensor, seq: torch.Tensor, idx: torch.Tensor, ok: torch.Tensor, bs: int) -> torch.Tensor:
    """Flat cache slots of the visible entries idx [R, N] (entry 0's slot where not ok)."""
    idx = torch.where(ok, idx, 0)
    return table[seq[:, None], idx // bs].to(torch.int64) * bs + idx % bs


def compressed_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    comp_cache: torch.Tensor,
    meta: AttentionMeta,
    comp_block_table: torch.Tensor,
    *,
    scale: float,
    window: int,
    ratio: int,
    sinks: torch.Tensor | None = None,
    topk_indices: torch.Tensor | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    op = "compressed_attention"
    t, h, d, nb, bs, nbc, bsc = check_compressed_attention(
        op, query, kv_cache, comp_cache, meta, comp_block_table, scale, window, ratio, sinks, topk_indices, return_lse
    )
    qsl, seq_lens = check_meta(op, meta, t, nb, bs)
    check_comp_block_table(op, comp_block_table, seq_lens, ratio, nbc, bsc)
    out = query.new_empty(t, h, d)
    lse = torch.empty(t, h, dtype=torch.float32, device=query.device)
    if t == 0 or h == 0:
        return (out, lse) if return_lse else out
    dev, acc = query.device, acc_dtype(query)
    seq, pos = _rows(qsl, seq_lens, dev)
    width = min(int(window), max(seq_lens))
    cands = topk_indices.shape[1] if topk_indices is not None else max(s // ratio for s in seq_lens)
    raw_flat, comp_flat = kv_cache.flatten(0, 1), comp_cache.flatten(0, 1)
    sink = None if sinks is None else sinks.to(acc)[None, :]
    step = max(1, _BUDGET // ((width + cands) * d))
    for r0 in range(0, t, step):
        r = slice(r0, min(t, r0 + step))
        s_, p_ = seq[r], pos[r]
        j = p_[:, None] - width + 1 + torch.arange(width, device=dev)[None, :]
        ok_raw = j >= 0
        if topk_indices is None:
            w = torch.arange(cands, device=dev)[None, :].expand(p_.shape[0], cands)
        else:
            w = topk_indices[r].to(torch.int64)
        ok_comp = (w >= 0) & (w < torch.div(p_ + 1, ratio, rounding_mode="floor")[:, None])
        keys = torch.cat(
            [
                raw_flat[_slots(meta.block_table, s_, j, ok_raw, bs)],
                comp_flat[_slots(comp_block_table, s_, w, ok_comp, bsc)],
            ],
            dim=1,
        ).to(acc)
        ok = torch.cat([ok_raw, ok_comp], dim=1)
        keys = keys.masked_fill(~ok[..., None], 0.0)
        logits = torch.einsum("rhd,rnd->rhn", query[r].to(acc), keys) * float(scale)
        logits = logits.masked_fill(~ok[:, None, :], _NEG_INF)
        row_lse = torch.logsumexp(logits, dim=-1)  # [R, H]
        denom = row_lse if sink is None else torch.logaddexp(row_lse, sink)
        denom = denom.masked_fill(denom == _NEG_INF, 0.0)
        p = torch.exp(logits - denom[..., None])
        out[r] = torch.einsum("rhn,rnd->rhd", p, keys).to(out.dtype)
        lse[r] = row_lse.to(torch.float32)
    return (out, lse) if return_lse else out
