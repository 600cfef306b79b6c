"""Reference DSA ops (DeepSeek-V3.2, GLM-5): the lightning indexer's key cache and its top-k,
and the mask that makes ``mla_attention`` sparse.

Written literally from the spec (``hetero.spec.attention``): a loop over sequences, keys
gathered through the block table, every score of a row computed and sorted. The fp8 key format
is computed in float32 whatever k's dtype (the spec pins its bits); scores are float32, float64
when any input is float64 (the oracle run). Over a compressed cache (spec 1.8, ``compress_ratio`` m) a
sequence holds ``seq_lens // m`` entries and a row at pos sees those before ``(pos + 1) // m``.
"""

from __future__ import annotations

import torch

from hetero.spec.attention import FP8_E4M3_MAX, INDEX_AMAX_FLOOR, INDEX_SCALE_GROUP
from hetero.spec.checks import INDEX_FP8, check_index_k_write, check_indexer_inputs, check_meta, check_slot_mapping
from hetero.spec.types import AttentionMeta
from hetero_cpu_ref._attend import NEG_INF, gather, scatter, used_blocks
from hetero_cpu_ref._util import acc_dtype

__all__ = ["write_index_k", "indexer_topk", "quantize_index_k", "sparse_mask"]

#: The most scores (rows x heads x keys) the indexer holds at once: rows are taken in chunks below it.
_SCORE_BUDGET = 1 << 22


def quantize_index_k(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k [T, D] in the fp8 format of write_index_k: (float8_e4m3fn [T, D], float32 scales [T, D // 128])."""
    t, d = k.shape
    groups = k.to(torch.float32).reshape(t, d // INDEX_SCALE_GROUP, INDEX_SCALE_GROUP)
    amax = groups.abs().amax(dim=-1, keepdim=True).clamp_min(INDEX_AMAX_FLOOR)
    scale = amax / FP8_E4M3_MAX
    q8 = (groups / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(INDEX_FP8)
    return q8.reshape(t, d), scale.reshape(t, d // INDEX_SCALE_GROUP)


def write_index_k(
    k: torch.Tensor,
    index_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    index_scale: torch.Tensor | None = None,
) -> None:
    op = "write_index_k"
    t, num_slots = check_index_k_write(op, k, index_cache, slot_mapping, index_scale)
    check_slot_mapping(op, slot_mapping, t, num_slots)
    if index_scale is None:
        scatter(index_cache, k, slot_mapping)
        return
    q8, scale = quantize_index_k(k)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    bs = index_cache.shape[1]
    # fp8 has no index_put on every device: write its bytes
    index_cache.view(torch.uint8)[slots // bs, slots % bs] = q8[keep].view(torch.uint8)
    scatter(index_scale, scale, slot_mapping)


def _keys(
    index_cache: torch.Tensor, index_scale: torch.Tensor | None, blocks: list[int], length: int, acc: torch.dtype
) -> torch.Tensor:
    """A sequence's first ``length`` index keys [L, D] in ``acc``, dequantized (``q8 * s``) in the fp8 format."""
    if index_scale is None:
        return gather(index_cache, blocks, length).to(acc)
    raw = gather(index_cache.view(torch.uint8), blocks, length).view(INDEX_FP8).to(acc)
    scale = gather(index_scale, blocks, length).to(acc)
    return (raw.unflatten(-1, (-1, INDEX_SCALE_GROUP)) * scale[..., None]).flatten(-2)


def _scores(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """score[n, j] = sum_h weights[n, h] * relu(q[n, h] . keys[j]), in keys' dtype."""
    logits = torch.einsum("nhd,ld->nhl", q.to(keys.dtype), keys).clamp_min(0)
    return torch.einsum("nhl,nh->nl", logits, weights.to(keys.dtype))


def _top(scores: torch.Tensor, pos: torch.Tensor, topk: int) -> torch.Tensor:
    """Per row, the min(topk, pos + 1) positions j <= pos of largest score (ties to the smaller
    position), then -1s: int32 [n, topk]. A row with pos -1 sees nothing."""
    n, length = scores.shape
    j = torch.arange(length, device=scores.device)
    scores = scores.masked_fill(j[None, :] > pos[:, None], NEG_INF)
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices[
        :, :topk
    ]  # stable: equal scores by position
    picked = torch.where(order <= pos[:, None], order, -1)  # the masked keys sort last
    out = torch.full((n, topk), -1, dtype=torch.int32, device=scores.device)
    out[:, : picked.shape[1]] = picked.to(torch.int32)
    return out


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
    entries = [length // m for length in seq_lens]  # key j of a compressed cache pools tokens [j*m, (j+1)*m)
    blocks = used_blocks(meta, entries, bs)
    acc = acc_dtype(q, weights, index_scale)
    out = torch.full((t, topk), -1, dtype=torch.int32, device=q.device)
    for b, length in enumerate(seq_lens):
        a, e = qsl[b], qsl[b + 1]
        if a == e:
            continue
        keys = _keys(index_cache, index_scale, blocks[b], entries[b], acc)
        step = max(1, _SCORE_BUDGET // max(1, hi * entries[b]))
        for r in range(a, e, step):
            rows = slice(r, min(e, r + step))
            pos = torch.arange(rows.start - a, rows.stop - a, device=q.device) + (length - (e - a))
            # key j is visible iff j < (pos + 1) // m: the rule j <= pos' of the last visible key pos'
            last = torch.div(pos + 1, m, rounding_mode="floor") - 1
            out[rows] = _top(_scores(q[rows], weights[rows], keys), last, topk)
    return out


def sparse_mask(indices: torch.Tensor, length: int, causal: bool) -> torch.Tensor:
    """bool [n, L]: the positions a sequence's rows of topk_indices [n, K] list that are visible to
    them (``0 <= j <= pos`` when causal, ``j < L`` otherwise); every other entry is skipped."""
    n = indices.shape[0]
    idx = indices.to(torch.int64)
    pos = torch.arange(n, device=idx.device)[:, None] + (length - n)
    ok = (idx >= 0) & ((idx <= pos) if causal else (idx < length))
    mask = torch.zeros(n, length + 1, dtype=torch.bool, device=idx.device)
    mask.scatter_(1, torch.where(ok, idx, length), True)  # column L collects the skipped entries
    return mask[:, :length]
