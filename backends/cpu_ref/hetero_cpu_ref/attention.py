"""Reference attention: paged KV cache (GQA/MQA and absorbed MLA), dense varlen, merging.

One loop over sequences; within a sequence everything is one masked softmax
(``_attend.attend``), shared by paged, varlen and MLA attention; sparse MLA (DSA,
``topk_indices``) only swaps the causal mask for ``dsa.sparse_mask``, and MLA's sinks (spec 1.7)
join the same denominator as paged attention's. Accumulation is in float32 (float64 when given
float64); outputs take the query's dtype and lse is float32. Semantics: ``hetero.spec.attention``.
"""

from __future__ import annotations

import torch

from hetero.spec.checks import (
    STAT_DTYPES,
    check_kv_write,
    check_meta,
    check_mla,
    check_mla_kv_write,
    check_options,
    check_out,
    check_paged_cache,
    check_same_device,
    check_sinks,
    check_slot_mapping,
    check_tensor,
    check_varlen,
    meta_tensors,
)
from hetero.spec.types import FLOAT_DTYPES, AttentionMeta
from hetero_cpu_ref._attend import NEG_INF, attend_all, gather, scatter, used_blocks
from hetero_cpu_ref._util import acc_dtype
from hetero_cpu_ref.dsa import sparse_mask

__all__ = ["write_kv", "paged_attention", "varlen_attention", "write_mla_kv", "mla_attention", "merge_attention"]


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
    scatter(k_cache, key, slot_mapping)
    scatter(v_cache, value, slot_mapping)


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
    blocks = used_blocks(meta, seq_lens, bs)

    def kv_of(b: int) -> tuple[torch.Tensor, torch.Tensor]:
        return gather(k_cache, blocks[b], seq_lens[b]), gather(v_cache, blocks[b], seq_lens[b])

    res = out if out is not None else query.new_empty(shape)
    lse = attend_all(query, qsl, kv_of, res, scale=scale, causal=causal, window=window, softcap=softcap, sinks=sinks)
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
    cq, ck = check_varlen(op, query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    tq, hq = query.shape[:2]

    def kv_of(b: int) -> tuple[torch.Tensor, torch.Tensor]:
        return key[ck[b] : ck[b + 1]], value[ck[b] : ck[b + 1]]

    res = query.new_empty(tq, hq, value.shape[2])
    lse = attend_all(query, cq, kv_of, res, scale=scale, causal=causal, window=window, softcap=softcap, sinks=None)
    return (res, lse) if return_lse else res


def write_mla_kv(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    ckv_cache: torch.Tensor,
    kpe_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    op = "write_mla_kv"
    check_mla_kv_write(op, kv_c, k_pe, ckv_cache, kpe_cache, slot_mapping)
    scatter(ckv_cache, kv_c, slot_mapping)
    scatter(kpe_cache, k_pe, slot_mapping)


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
    topk_indices: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    op = "mla_attention"
    scale, window, _ = check_options(op, scale, causal, (-1, -1), 0.0, return_lse)
    t, h, lkv, bs, qsl, seq_lens = check_mla(op, q_nope, q_pe, ckv_cache, kpe_cache, meta, topk_indices)
    check_sinks(op, sinks, h)
    check_same_device(op, q_nope=q_nope, sinks=sinks)
    blocks = used_blocks(meta, seq_lens, bs)

    def mask_of(b: int) -> torch.Tensor:  # sparse (DSA): the listed positions among the visible ones
        return sparse_mask(topk_indices[qsl[b] : qsl[b + 1]], seq_lens[b], causal)

    def kv_of(b: int) -> tuple[torch.Tensor, torch.Tensor]:
        ckv = gather(ckv_cache, blocks[b], seq_lens[b])[:, None]  # one latent KV head
        kpe = gather(kpe_cache, blocks[b], seq_lens[b])[:, None]
        return torch.cat([ckv, kpe], dim=-1), ckv

    query = torch.cat([q_nope, q_pe], dim=-1)  # logits = q_nope.ckv + q_pe.kpe
    res = q_nope.new_empty(t, h, lkv)
    lse = attend_all(
        query,
        qsl,
        kv_of,
        res,
        None if topk_indices is None else mask_of,
        scale=scale,
        causal=causal,
        window=window,
        softcap=0.0,
        sinks=sinks,
    )
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
    ref = lse.masked_fill(lse == NEG_INF, 0.0)  # both sides empty: weights exp(-inf) = 0
    out = torch.zeros(out_a.shape, dtype=acc, device=out_a.device)
    for side, side_lse in ((out_a, la), (out_b, lb)):
        w = torch.exp(side_lse - ref)[..., None]
        out += torch.where(w > 0, w * side.to(acc), 0.0)  # an empty side contributes nothing
    return out.to(out_a.dtype), lse.to(torch.float32)
