"""indexer_topk (DSA's lightning indexer fused with its top-k), batched with torch ops.

Each sequence's index keys are gathered through the block table into the padded groups of
``_attention_plan`` (dequantized ``q8 * s`` in the fp8 format), every query row's scores against
them come from two batched einsums, and a stable descending sort picks the top keys (a tie goes
to the smaller position). Scores are float32, float64 when any input is float64. Over a compressed
cache (spec 1.8) the groups span ``seq_lens // m`` entries and each row's last visible entry stands
for its position. Semantics: ``hetero.spec.attention``.
"""

from __future__ import annotations

import torch

from hetero.spec.attention import INDEX_SCALE_GROUP
from hetero.spec.checks import INDEX_FP8, check_indexer_inputs, check_meta
from hetero.spec.types import AttentionMeta
from hetero_torch._attention_core import NEG_INF, acc_dtype
from hetero_torch._attention_plan import Batch, gather_paged, pad, plan

__all__ = ["indexer_topk"]


def _keys(
    index_cache: torch.Tensor, index_scale: torch.Tensor | None, table: torch.Tensor, batch: Batch, acc: torch.dtype
) -> torch.Tensor:
    """Every sequence's index keys [B, Lmax, D] in ``acc``, dequantized in the fp8 format."""
    if index_scale is None:
        return gather_paged(index_cache, table, batch).to(acc)
    raw = gather_paged(index_cache.view(torch.uint8), table, batch).view(INDEX_FP8).to(acc)
    scale = gather_paged(index_scale, table, batch).to(acc)
    return (raw.unflatten(-1, (-1, INDEX_SCALE_GROUP)) * scale[..., None]).flatten(-2)


def _top(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, pos: torch.Tensor, topk: int) -> torch.Tensor:
    """q [B, n, Hi, D], w [B, n, Hi], keys [B, L, D], pos [B, n] -> int32 [B, n, topk]: per row the
    min(topk, pos + 1) positions j <= pos of largest score (ties to the smaller position), then -1s
    (pos -1: nothing visible)."""
    logits = torch.einsum("bnhd,bld->bnhl", q, keys).clamp_min(0)
    scores = torch.einsum("bnhl,bnh->bnl", logits, w)
    j = torch.arange(keys.shape[1], device=q.device)
    scores = scores.masked_fill(j > pos[..., None], NEG_INF)
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :topk]  # masked keys sort last
    picked = torch.where(order <= pos[..., None], order, -1).to(torch.int32)
    if picked.shape[-1] < topk:
        picked = torch.nn.functional.pad(picked, (0, topk - picked.shape[-1]), value=-1)
    return picked


def indexer_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_cache: torch.Tensor,
    meta: AttentionMeta,
    *,
    topk: int,
    index_scale: torch.Tensor | None = None,
    compress_ratio: int = 1,
) -> torch.Tensor:
    op = "indexer_topk"
    t, hi, _, nb, bs, topk = check_indexer_inputs(op, q, weights, index_cache, meta, topk, index_scale, compress_ratio)
    m = int(compress_ratio)
    qsl, seq_lens = check_meta(op, meta, t, nb, bs, m)
    acc = acc_dtype(q, weights, index_scale)
    res = torch.full((t, topk), -1, dtype=torch.int32, device=q.device)
    if m == 1:
        groups, last = plan(qsl, seq_lens, hi, q.device), None
    else:  # compressed keys (spec 1.8): seq_lens // m entries, the last one a row sees (pos + 1) // m - 1
        groups, last = plan(qsl, [n // m for n in seq_lens], hi, q.device), _last_entries(qsl, seq_lens, m, q.device)
    for batch in groups:
        keys = _keys(index_cache, index_scale, meta.block_table, batch, acc)
        pos = batch.positions() if last is None else pad(last, batch)
        picked = _top(pad(q, batch).to(acc), pad(weights, batch).to(acc), keys, pos, topk)
        res.index_copy_(0, batch.tok, picked[batch.seq, batch.row])
    return res


def _last_entries(qsl: list[int], seq_lens: list[int], m: int, device: torch.device) -> torch.Tensor:
    """int64 [T]: per packed row at position pos, ``(pos + 1) // m - 1``, its last visible compressed entry."""
    lens = torch.tensor(seq_lens, dtype=torch.int64)
    n = torch.tensor(qsl[1:], dtype=torch.int64) - torch.tensor(qsl[:-1], dtype=torch.int64)
    seq = torch.repeat_interleave(torch.arange(len(seq_lens)), n)
    pos = torch.arange(qsl[-1] if qsl else 0) - torch.tensor(qsl[:-1], dtype=torch.int64)[seq] + (lens - n)[seq]
    return (torch.div(pos + 1, m, rounding_mode="floor") - 1).to(device)
