"""Reference attention: paged KV cache (GQA/MQA and absorbed MLA), dense varlen, merging.

One loop over sequences; within a sequence everything is one masked softmax
(``_attend``), shared by paged, varlen and MLA attention. Accumulation is in
float32 (float64 when given float64); outputs take the query's dtype and lse is
float32. Semantics: ``hetero.spec.attention``.
"""
from __future__ import annotations

from typing import Callable

import torch

from hetero.spec.checks import (
    check_cu_seqlens,
    check_kv_write,
    check_mla_inputs,
    check_meta,
    check_same_device,
    check_slot_mapping,
    check_tensor,
)
from hetero.spec.types import FLOAT_DTYPES, AttentionMeta

from hetero_cpu_ref._attention_checks import (
    STAT_DTYPES,
    check_gqa,
    check_max_len,
    check_options,
    check_out,
    check_paged_cache,
    check_sinks,
    meta_tensors,
)
from hetero_cpu_ref._util import acc_dtype

__all__ = ["write_kv", "paged_attention", "varlen_attention", "write_mla_kv", "mla_attention", "merge_attention"]

_NEG_INF = float("-inf")


# ----------------------------------------------------------------------------- core


def _visible(n: int, length: int, causal: bool, window: tuple[int, int], device: torch.device) -> torch.Tensor:
    """bool [n, L]: key j visible to query row i, which sits at position L - n + i."""
    pos = torch.arange(n, device=device)[:, None] + (length - n)
    j = torch.arange(length, device=device)[None, :]
    mask = torch.ones(n, length, dtype=torch.bool, device=device)
    if causal:
        mask &= j <= pos
    if window[0] >= 0:
        mask &= j >= pos - window[0]
    if window[1] >= 0:
        mask &= j <= pos + window[1]
    return mask


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    causal: bool,
    window: tuple[int, int],
    softcap: float,
    sinks: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence: q [n, Hq, D], k [L, Hkv, D], v [L, Hkv, Dv], all in the accumulation dtype.

    Returns out [n, Hq, Dv] and lse [n, Hq]; a row with no visible key gets 0 and -inf.
    """
    n, hq, d = q.shape
    length, hkv, dv = k.shape[0], k.shape[1], v.shape[2]
    g = hq // hkv  # query head h reads KV head h // g
    s = torch.einsum("nkgd,lkd->kgnl", q.reshape(n, hkv, g, d), k).reshape(hq, n, length) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~_visible(n, length, causal, window, q.device), _NEG_INF)
    lse = torch.logsumexp(s, dim=-1)  # [Hq, n], -inf for a row with no visible key
    denom = lse if sinks is None else torch.logaddexp(lse, sinks.to(lse.dtype)[:, None])
    denom = denom.masked_fill(denom == _NEG_INF, 0.0)  # empty row: exp(-inf - 0) = 0, not NaN
    p = torch.exp(s - denom[..., None])
    out = torch.einsum("kgnl,lkd->nkgd", p.reshape(hkv, g, n, length), v).reshape(n, hq, dv)
    return out, lse.transpose(0, 1)


def _attend_all(
    query: torch.Tensor,
    starts: list[int],
    kv_of: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    out: torch.Tensor,
    **opts,
) -> torch.Tensor:
    """Attend each sequence's rows [starts[b], starts[b+1]) of query to kv_of(b), writing into out.

    Every row belongs to one sequence (starts runs from 0 to T), so out is fully
    written. Returns lse float32 [T, Hq].
    """
    acc = acc_dtype(query)
    lse = torch.empty(query.shape[:2], dtype=torch.float32, device=query.device)
    for b in range(len(starts) - 1):
        a, e = starts[b], starts[b + 1]
        if a == e:
            continue
        k, v = kv_of(b)
        o, seq_lse = _attend(query[a:e].to(acc), k.to(acc), v.to(acc), **opts)
        out[a:e] = o
        lse[a:e] = seq_lse
    return lse


def _gather(cache: torch.Tensor, blocks: list[int], length: int) -> torch.Tensor:
    """The first `length` positions of a sequence from a paged cache [NB, BS, ...] -> [length, ...]."""
    ids = torch.tensor(blocks, dtype=torch.long, device=cache.device)
    return cache.index_select(0, ids).flatten(0, 1)[:length]


def _scatter(dst: torch.Tensor, src: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """dst[slot // BS, slot % BS] = src[t] for every token t whose slot is not -1 (in place)."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    bs = dst.shape[1]
    dst[slots // bs, slots % bs] = src[keep].to(dst.dtype)


# ----------------------------------------------------------------------------- ops


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    op = "write_kv"
    t, num_slots = check_kv_write(op, key, value, k_cache, v_cache)
    check_same_device(op, key=key, value=value, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    check_slot_mapping(op, slot_mapping, t, num_slots)
    _scatter(k_cache, key, slot_mapping)
    _scatter(v_cache, value, slot_mapping)


def _used_blocks(meta: AttentionMeta, seq_lens: list[int], block_size: int) -> list[list[int]]:
    """Per sequence, the block ids that hold its seq_lens[b] keys (check_meta has checked them)."""
    used = -(-max(seq_lens, default=0) // block_size)
    table = meta.block_table[:, :used].tolist()  # a persistent table is as wide as max_model_len allows
    return [row[: -(-length // block_size)] for row, length in zip(table, seq_lens)]


def paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMeta,
    *,
    scale: float,
    causal: bool = True,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    op = "paged_attention"
    scale, window, softcap = check_options(op, scale, causal, window, softcap, return_lse)
    nb, bs = check_paged_cache(op, query, k_cache, v_cache)
    t, hq = query.shape[:2]
    check_sinks(op, sinks, hq)
    shape = (t, hq, v_cache.shape[3])
    check_out(op, out, shape, query)
    check_same_device(op, query=query, k_cache=k_cache, v_cache=v_cache, sinks=sinks, **meta_tensors(meta))
    qsl, seq_lens = check_meta(op, meta, t, nb, bs)
    blocks = _used_blocks(meta, seq_lens, bs)

    def kv_of(b: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _gather(k_cache, blocks[b], seq_lens[b]), _gather(v_cache, blocks[b], seq_lens[b])

    res = out if out is not None else query.new_empty(shape)
    lse = _attend_all(query, qsl, kv_of, res, scale=scale, causal=causal, window=window, softcap=softcap, sinks=sinks)
    return (res, lse) if return_lse else res


def varlen_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    scale: float,
    causal: bool = True,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    op = "varlen_attention"
    scale, window, softcap = check_options(op, scale, causal, window, softcap, return_lse)
    check_tensor(op, "query", query, ndim=3, dtypes=FLOAT_DTYPES)
    (tq, hq, d), dt = query.shape, (query.dtype,)
    check_tensor(op, "key", key, shape=(None, None, d), dtypes=dt)
    tk, hkv = key.shape[:2]
    check_tensor(op, "value", value, shape=(tk, hkv, None), dtypes=dt)
    check_gqa(op, "key", hq, hkv)
    check_same_device(op, query=query, key=key, value=value, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    cq = check_cu_seqlens(op, "cu_seqlens_q", cu_seqlens_q, tq)
    ck = check_cu_seqlens(op, "cu_seqlens_k", cu_seqlens_k, tk, len(cq) - 1)
    check_max_len(op, "max_seqlen_q", max_seqlen_q, cq)
    check_max_len(op, "max_seqlen_k", max_seqlen_k, ck)

    def kv_of(b: int) -> tuple[torch.Tensor, torch.Tensor]:
        return key[ck[b] : ck[b + 1]], value[ck[b] : ck[b + 1]]

    res = query.new_empty(tq, hq, value.shape[2])
    lse = _attend_all(query, cq, kv_of, res, scale=scale, causal=causal, window=window, softcap=softcap, sinks=None)
    return (res, lse) if return_lse else res


def write_mla_kv(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    ckv_cache: torch.Tensor,
    kpe_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    op = "write_mla_kv"
    check_tensor(op, "kv_c", kv_c, ndim=2, dtypes=FLOAT_DTYPES)
    t, lkv = kv_c.shape
    dt = (kv_c.dtype,)
    check_tensor(op, "k_pe", k_pe, shape=(t, None), dtypes=dt)
    check_tensor(op, "ckv_cache", ckv_cache, shape=(None, None, lkv), dtypes=dt)
    nb, bs = ckv_cache.shape[:2]
    check_tensor(op, "kpe_cache", kpe_cache, shape=(nb, bs, k_pe.shape[1]), dtypes=dt)
    check_same_device(op, kv_c=kv_c, k_pe=k_pe, ckv_cache=ckv_cache, kpe_cache=kpe_cache, slot_mapping=slot_mapping)
    check_slot_mapping(op, slot_mapping, t, nb * bs)
    _scatter(ckv_cache, kv_c, slot_mapping)
    _scatter(kpe_cache, k_pe, slot_mapping)


def mla_attention(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    ckv_cache: torch.Tensor,
    kpe_cache: torch.Tensor,
    meta: AttentionMeta,
    *,
    scale: float,
    causal: bool = True,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    op = "mla_attention"
    scale, window, _ = check_options(op, scale, causal, (-1, -1), 0.0, return_lse)
    t, h, lkv, nb, bs = check_mla_inputs(op, q_nope, q_pe, ckv_cache, kpe_cache, FLOAT_DTYPES)
    check_same_device(op, q_nope=q_nope, q_pe=q_pe, ckv_cache=ckv_cache, kpe_cache=kpe_cache, **meta_tensors(meta))
    qsl, seq_lens = check_meta(op, meta, t, nb, bs)
    blocks = _used_blocks(meta, seq_lens, bs)

    def kv_of(b: int) -> tuple[torch.Tensor, torch.Tensor]:
        ckv = _gather(ckv_cache, blocks[b], seq_lens[b])[:, None]  # one latent KV head
        kpe = _gather(kpe_cache, blocks[b], seq_lens[b])[:, None]
        return torch.cat([ckv, kpe], dim=-1), ckv

    query = torch.cat([q_nope, q_pe], dim=-1)  # logits = q_nope.ckv + q_pe.kpe
    res = q_nope.new_empty(t, h, lkv)
    lse = _attend_all(query, qsl, kv_of, res, scale=scale, causal=causal, window=window, softcap=0.0, sinks=None)
    return (res, lse) if return_lse else res


def merge_attention(
    out_a: torch.Tensor,
    lse_a: torch.Tensor,
    out_b: torch.Tensor,
    lse_b: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    op = "merge_attention"
    check_tensor(op, "out_a", out_a, ndim=3, dtypes=FLOAT_DTYPES)
    check_tensor(op, "out_b", out_b, shape=tuple(out_a.shape), dtypes=(out_a.dtype,))
    check_tensor(op, "lse_a", lse_a, shape=tuple(out_a.shape[:2]), dtypes=STAT_DTYPES)
    check_tensor(op, "lse_b", lse_b, shape=tuple(out_a.shape[:2]), dtypes=STAT_DTYPES)
    check_same_device(op, out_a=out_a, lse_a=lse_a, out_b=out_b, lse_b=lse_b)
    acc = acc_dtype(out_a, lse_a, lse_b)
    la, lb = lse_a.to(acc), lse_b.to(acc)
    lse = torch.logaddexp(la, lb)
    ref = lse.masked_fill(lse == _NEG_INF, 0.0)  # both sides empty: weights exp(-inf) = 0
    out = torch.zeros(out_a.shape, dtype=acc, device=out_a.device)
    for side, side_lse in ((out_a, la), (out_b, lb)):
        w = torch.exp(side_lse - ref)[..., None]
        out += torch.where(w > 0, w * side.to(acc), 0.0)  # an empty side contributes nothing
    return out.to(out_a.dtype), lse.to(torch.float32)
