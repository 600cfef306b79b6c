"""Attention from torch's batched operators: paged KV cache (GQA/MQA and absorbed MLA, dense or
sparse), dense varlen, merging, and the writes into the paged caches.

Every op validates as the reference does (shapes, dtypes, devices, then the metadata's values
on the host, so every gather and scatter index is in range on any device), then runs batched:
the sequences are cut into a few padded groups (``_attention_plan``: one for a decode batch),
each group's keys gathered through the block table into [Bg, L, Hkv, D], one mask carries
causality (bottom-right), the window and the padding, and one masked softmax
(``_attention_core``: batched matmuls, or torch's fused ``scaled_dot_product_attention`` when no
softcap, sinks or lse are asked) computes it. Accumulation is float32 (float64 for float64
inputs). Writes are one ``index_put_`` per cache. Semantics: ``hetero.spec.attention``.
"""

from __future__ import annotations

import torch

from hetero.spec.attention import FP8_E4M3_MAX, INDEX_AMAX_FLOOR, INDEX_SCALE_GROUP
from hetero.spec.checks import (
    INDEX_FP8,
    check_index_k_write,
    check_kv_write,
    check_meta,
    check_meta_shapes,
    check_mla_kv_write,
    check_options,
    check_out,
    check_paged_cache,
    check_same_device,
    check_sinks,
    check_slot_mapping,
    check_tensor,
    meta_tensors,
)
from hetero.spec.types import AttentionMeta
from hetero_torch import _attention_native as native
from hetero_torch import _step_plan
from hetero_torch._attention_core import compute, run, visible
from hetero_torch._attention_decode import decode, is_decode
from hetero_torch._attention_dense import merge_attention, varlen_attention
from hetero_torch._attention_indexer import indexer_topk
from hetero_torch._attention_mla import mla_attention
from hetero_torch._attention_plan import Batch, gather_paged, pad, plan
from hetero_torch._opaque import opaque

__all__ = [
    "write_kv",
    "paged_attention",
    "varlen_attention",
    "write_mla_kv",
    "mla_attention",
    "merge_attention",
    "write_index_k",
    "indexer_topk",
]


def _kept_slots(
    slot_mapping: torch.Tensor, cache: torch.Tensor
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """(keep, (block, offset)): the tokens whose slot is in [0, NB*BS) of ``cache`` and their cache
    index (-1 skips a token; a slot out of range, possible only with validation off, is skipped too)."""
    keep = (slot_mapping >= 0) & (slot_mapping < cache.shape[0] * cache.shape[1])
    slots = slot_mapping[keep]
    return keep, (slots // cache.shape[1], slots % cache.shape[1])


def _scatter_slots(dst: torch.Tensor, src: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """dst[slot // BS, slot % BS] = src[t] for every kept token t (``_kept_slots``), in one index_put_."""
    keep, index = _kept_slots(slot_mapping, dst)
    dst.index_put_(index, src[keep].to(dst.dtype))


# torch.compile sees the scatter as one opaque op: selecting the kept slots has a data-dependent
# size, which would break the graph at every layer. Eager calls skip the custom op's dispatch.
_scatter_op = opaque("scatter_slots", _scatter_slots, lambda dst, src, slot_mapping: None, mutates_args=("dst",))


def _scatter(dst: torch.Tensor, src: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    (_scatter_op if torch.compiler.is_compiling() else _scatter_slots)(dst, src, slot_mapping)


def _scatter_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Both caches' scatters, the kept slots selected once."""
    keep, index = _kept_slots(slot_mapping, k_cache)
    k_cache.index_put_(index, key[keep].to(k_cache.dtype))
    v_cache.index_put_(index, value[keep].to(v_cache.dtype))


# one opaque op per layer rather than two
_scatter_kv_op = opaque(
    "scatter_kv",
    _scatter_kv,
    lambda k_cache, v_cache, key, value, slot_mapping: None,
    mutates_args=("k_cache", "v_cache"),
)


# ----------------------------------------------------------------------------- writes


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    op = "write_kv"
    t, _ = check_kv_write(op, key, value, k_cache, v_cache)
    check_same_device(op, key=key, value=value, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    check_tensor(op, "slot_mapping", slot_mapping, shape=(t,), dtypes=(torch.int64,))  # values: the registry's
    if native.applies(k_cache, v_cache, key, value):
        native.write_kv(key, value, k_cache, v_cache, slot_mapping)
        return
    (_scatter_kv_op if torch.compiler.is_compiling() else _scatter_kv)(k_cache, v_cache, key, value, slot_mapping)


def write_mla_kv(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    ckv_cache: torch.Tensor,
    kpe_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    op = "write_mla_kv"
    check_mla_kv_write(op, kv_c, k_pe, ckv_cache, kpe_cache, slot_mapping)
    _scatter(ckv_cache, kv_c, slot_mapping)
    _scatter(kpe_cache, k_pe, slot_mapping)


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
        _scatter(index_cache, k, slot_mapping)
        return
    d = k.shape[1]
    groups = k.to(torch.float32).reshape(t, d // INDEX_SCALE_GROUP, INDEX_SCALE_GROUP)
    scale = groups.abs().amax(dim=-1, keepdim=True).clamp_min(INDEX_AMAX_FLOOR) / FP8_E4M3_MAX
    q8 = (groups / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(INDEX_FP8).reshape(t, d)
    _scatter(index_cache.view(torch.uint8), q8.view(torch.uint8), slot_mapping)  # fp8 lacks index_put on some devices
    _scatter(index_scale, scale.reshape(t, d // INDEX_SCALE_GROUP), slot_mapping)


# ----------------------------------------------------------------------------- attention


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
    res = out if out is not None else query.new_empty(shape)
    check_meta_shapes(op, meta, t)
    planned = _step_plan.attention(meta, t, nb, bs)
    options = dict(scale=scale, causal=causal, window=window, softcap=softcap, sinks=sinks, return_lse=return_lse)
    if native.applies(k_cache, v_cache, query, sinks=sinks):
        if meta.max_query_len < SDPA_MIN_ROWS or softcap or sinks is not None or return_lse:
            return native.paged_attention(query, k_cache, v_cache, planned.native if planned else meta, res, **options)
        return _native_and_sdpa(query, k_cache, v_cache, meta, planned, res, **options)
    if is_decode(meta, t):
        return decode(
            op,
            query,
            k_cache,
            v_cache,
            meta,
            res,
            scale=scale,
            window=window,
            softcap=softcap,
            sinks=sinks,
            return_lse=return_lse,
        )
    if planned is None:
        groups = plan(*check_meta(op, meta, t, nb, bs), hq, query.device)
    else:
        groups = planned.groups(hq, query.device)
    return _grouped(query, k_cache, v_cache, meta.block_table, groups, res, **options)


def _grouped(query, k_cache, v_cache, block_table, groups: list[Batch], res, *, causal, window, widen=False, **options):
    """The torch operators' path over padded groups of sequences (``_attention_plan``); ``widen``: in
    float32 whatever the inputs' dtype (the native kernel's precision), rounded once into res."""
    softcap, sinks, return_lse, scale = options["softcap"], options["sinks"], options["return_lse"], options["scale"]
    acc = torch.float32 if widen and query.dtype != torch.float64 else query.dtype

    def step(batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None]:
        k, v = gather_paged(k_cache, block_table, batch).to(acc), gather_paged(v_cache, block_table, batch).to(acc)
        q, mask = pad(query, batch).to(acc), visible(batch, causal, window)
        return compute(q, k, v, mask, batch, scale=scale, softcap=softcap, sinks=sinks, need_lse=return_lse)

    return run(groups, res, return_lse, step)


#: Sequences of a batch from the first with more than one query row on go through torch's fused SDPA
#: (flash attention) when the batch has a chunk of at least this many rows and SDPA serves the call
#: (no softcap, sinks or lse): fresh prompts in their own dtype, chunks over cached context in float32;
#: the decodes before them stay with the native kernel. SDPA over the gathered keys is faster on long
#: chunks (benchmarks/attention_cpu.py --shape qwen3-0.6b).
SDPA_MIN_ROWS = 64


def _native_and_sdpa(query, k_cache, v_cache, meta: AttentionMeta, planned, res, **options):
    """paged_attention split at the first sequence p with more than one query row: [0, p) native, [p, B)
    through ``_grouped`` (its host lists checked, or the step plan's)."""
    nb, bs = k_cache.shape[:2]
    starts, seq_lens = (
        (planned.starts, planned.seq_lens) if planned else check_meta("paged_attention", meta, query.shape[0], nb, bs)
    )
    p = next((b for b in range(len(seq_lens)) if starts[b + 1] - starts[b] > 1), len(seq_lens))
    row = starts[p]
    if p:
        qsl, lens, table = planned.native if planned else native.index_of(meta)
        head = (qsl[: p + 1], lens[:p], table[:p])
        native.paged_attention(query[:row], k_cache, v_cache, head, res[:row], **options)
    hq = query.shape[1]
    suffix = range(p, len(seq_lens))
    fresh = options["window"] == (-1, -1) and all(starts[b + 1] - starts[b] == seq_lens[b] for b in suffix)
    if fresh:  # new prompts only: each is one SDPA call over its own keys, causal without a mask
        for b in suffix:
            _fresh_prompt(query, k_cache, v_cache, meta.block_table[b], starts[b], seq_lens[b], res, **options)
        return res
    if planned is not None:
        groups = planned.groups(hq, query.device, p)
    else:
        groups = plan([s - row for s in starts[p:]], seq_lens[p:], hq, query.device)
    _grouped(query[row:], k_cache, v_cache, meta.block_table[p:], groups, res[row:], widen=True, **options)
    return res


def _fresh_prompt(query, k_cache, v_cache, table_row, start: int, length: int, res, *, causal, scale, **_):
    """res rows [start, start + length) of a sequence whose keys are its own query rows (no cached
    context): one call of torch's SDPA with ``is_causal`` and ``enable_gqa`` (no mask tensor and no
    expanded keys: its flash kernel) in the query's dtype, over the keys gathered from its blocks (ids
    clamped into the cache). In bf16 it rounds P to bf16 before P @ V, as the spec's bf16 tolerance
    allows; 16 fresh prompts of 16-127 tokens at Qwen3-0.6B's heads took 15.6 ms a layer in float32
    with expanded keys, 9.3 ms so."""
    if length == 0:
        return
    nb, bs = k_cache.shape[:2]
    blocks = table_row[: -(-length // bs)].to(torch.int64).clamp(0, nb - 1)

    def keys(cache: torch.Tensor) -> torch.Tensor:
        return cache.index_select(0, blocks).flatten(0, 1)[:length].transpose(0, 1)[None]

    q = query[start : start + length].transpose(0, 1)[None]
    out = torch.nn.functional.scaled_dot_product_attention(
        q, keys(k_cache), keys(v_cache), is_causal=causal, scale=scale, enable_gqa=True
    )
    res[start : start + length] = out[0].transpose(0, 1).to(res.dtype)
