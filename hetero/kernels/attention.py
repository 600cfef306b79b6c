"""Triton attention: paged_attention, varlen_attention and mla_attention over one kernel.

Semantics: ``hetero.spec.attention``. The kernel (``_attention_kernels``) is a flash-style
forward pass; this module validates the cheap things (ranks, dtypes, shapes, devices,
the GQA ratio, option values), builds the tile table and launches it.

Launch shape (what a GPU runs): grid ``(tiles, KV heads)``. A sequence with n query rows
and a GQA group of G query heads per KV head has ``n * G`` flattened (token, head) rows,
cut into tiles of ``BLOCK_M`` rows; one program computes one tile against its KV head,
so each K/V tile it loads serves all G query heads. Prefill, chunked prefill and decode
are the same launch: decode is one token (G rows) per sequence. MLA is the same with one
latent KV head and G = H.

The tile table (tile -> sequence, first flattened row) is built on the device with torch
ops from the cumulative query lengths (a cumsum and a searchsorted, no host sync); the
grid is a host-known upper bound on the tile count, ``min(ceil(T * G / BLOCK_M) + B,
B * ceil(max_query_len * G / BLOCK_M))``, and programs past the last tile exit at once.
Metadata values are never read on the host and never trusted by the kernel (see
``_attention_kernels``): decreasing query_start_loc gives a sequence no tiles, rows and keys are
clamped into the tensors, block ids outside [0, NB) read as zero keys and values, and
max_query_len only sizes the grid (too small leaves rows unwritten, too large adds idle programs).
Each program streams only the key tiles its rows can see (causal / window bounds), so
a decode row of a long context costs ``ceil(L / BLOCK_N)`` steps and a sliding-window row
``ceil(window / BLOCK_N) + 1``.

mla_attention with ``topk_indices`` (DSA's sparse attention) is a kernel of its own, one program per
query row and block of heads gathering the listed positions: ``hetero.kernels.dsa``. Sinks (paged
attention's, and MLA's from spec 1.7, dense or sparse) join each row's denominator once, after its
last key tile.

Tuning entries ("paged_attention", "varlen_attention", "mla_attention"): ``BLOCK_M``
(flattened rows per program; shrunk to the batch's longest query times G when that is
smaller, never below 16), ``BLOCK_N`` (keys per step), ``num_warps``, ``num_stages``.
Under the interpreter, bf16 operands of ``tl.dot`` are upcast to float32 (the interpreter
of triton 3.9 returns garbage for a bf16 dot). Float32 dots run at IEEE precision (no
TF32), so a float32 call is as accurate as float32 arithmetic.
"""

from __future__ import annotations

from typing import Any

import torch

from hetero.kernels._triton import triton_modules
from hetero.kernels.tuning import Tuning
from hetero.spec._checks_dsa import check_topk_indices
from hetero.spec._checks_meta import check_meta_shapes
from hetero.spec.checks import INDEX_DTYPES, check_mla_inputs, check_same_device, check_tensor, expect, meta_tensors
from hetero.spec.types import AttentionMeta

triton, tl = triton_modules()

from hetero.kernels import dsa  # noqa: E402  (after Triton is set up)
from hetero.kernels._attention_launch import (  # noqa: E402
    KERNEL_DTYPES,
    STAT_DTYPES,
    check_gqa,
    check_options,
    check_out,
    is_int,
    launch,
    results,
)

__all__ = ["paged_attention", "varlen_attention", "mla_attention"]


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
    tuning: Tuning,
) -> Any:
    op = "paged_attention"
    scale, window, softcap = check_options(op, scale, causal, window, softcap, return_lse)
    check_tensor(op, "query", query, ndim=3, dtypes=KERNEL_DTYPES)
    t, hq, d = query.shape
    dt = (query.dtype,)
    check_tensor(op, "k_cache", k_cache, shape=(None, None, None, d), dtypes=dt)
    nb, bs, hkv = k_cache.shape[:3]
    check_tensor(op, "v_cache", v_cache, shape=(nb, bs, hkv, None), dtypes=dt)
    expect(bs >= 1, op, "k_cache", "a block size >= 1", f"shape {list(k_cache.shape)}")
    check_gqa(op, "k_cache", hq, hkv)
    if sinks is not None:
        check_tensor(op, "sinks", sinks, shape=(hq,), dtypes=STAT_DTYPES)
    shape = (t, hq, v_cache.shape[3])
    check_out(op, out, shape, query)
    meta = check_meta_shapes(op, meta, t)
    check_same_device(op, query=query, k_cache=k_cache, v_cache=v_cache, sinks=sinks, **meta_tensors(meta))

    res = out if out is not None else query.new_empty(shape)
    lse = torch.empty((t, hq), dtype=torch.float32, device=query.device) if return_lse else None
    if t == 0 or hq == 0:
        return results(res, lse, return_lse)
    launch(
        kernel=op,
        tuning=tuning,
        query=query,
        q2=None,
        key=k_cache,
        k2=None,
        value=v_cache,
        out=res,
        lse=lse,
        sinks=sinks,
        paged=True,
        table=meta.block_table,
        kv_lens=meta.seq_lens,
        cu_q=meta.query_start_loc,
        cu_k=None,
        batch=meta.num_seqs,
        num_kv_heads=hkv,
        longest_q=min(meta.max_query_len, t) or t,
        block_size=bs,
        scale=scale,
        causal=causal,
        window=window,
        softcap=softcap,
    )
    return results(res, lse, return_lse)


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
    tuning: Tuning,
) -> Any:
    op = "varlen_attention"
    scale, window, softcap = check_options(op, scale, causal, window, softcap, return_lse)
    check_tensor(op, "query", query, ndim=3, dtypes=KERNEL_DTYPES)
    (tq, hq, d), dt = query.shape, (query.dtype,)
    check_tensor(op, "key", key, shape=(None, None, d), dtypes=dt)
    tk, hkv = key.shape[:2]
    check_tensor(op, "value", value, shape=(tk, hkv, None), dtypes=dt)
    check_gqa(op, "key", hq, hkv)
    check_tensor(op, "cu_seqlens_q", cu_seqlens_q, ndim=1, dtypes=INDEX_DTYPES)
    batch = cu_seqlens_q.shape[0] - 1
    expect(batch >= 0, op, "cu_seqlens_q", "at least one entry", "none")
    check_tensor(op, "cu_seqlens_k", cu_seqlens_k, shape=(batch + 1,), dtypes=INDEX_DTYPES)
    for name, v in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        expect(is_int(v) and v >= 0, op, name, "an int >= 0", repr(v))
    check_same_device(op, query=query, key=key, value=value, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)

    res = query.new_empty(tq, hq, value.shape[2])
    lse = torch.empty((tq, hq), dtype=torch.float32, device=query.device) if return_lse else None
    if tq == 0 or hq == 0:
        return results(res, lse, return_lse)
    expect(batch >= 1, op, "cu_seqlens_q", f"at least one sequence for {tq} tokens", "none")
    launch(
        kernel=op,
        tuning=tuning,
        query=query,
        q2=None,
        key=key[:, None],
        k2=None,
        value=value[:, None],
        out=res,
        lse=lse,
        sinks=None,
        paged=False,
        table=None,
        kv_lens=None,
        cu_q=cu_seqlens_q,
        cu_k=cu_seqlens_k,
        batch=batch,
        num_kv_heads=hkv,
        longest_q=min(max_seqlen_q, tq) or tq,
        block_size=1,
        scale=scale,
        causal=causal,
        window=window,
        softcap=softcap,
    )
    return results(res, lse, return_lse)


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
    tuning: Tuning,
) -> Any:
    op = "mla_attention"
    scale, _, _ = check_options(op, scale, causal, (-1, -1), 0.0, return_lse)
    t, h, lkv, nb, bs = check_mla_inputs(op, q_nope, q_pe, ckv_cache, kpe_cache, KERNEL_DTYPES)
    if sinks is not None:
        check_tensor(op, "sinks", sinks, shape=(h,), dtypes=STAT_DTYPES)
    meta = check_meta_shapes(op, meta, t)
    check_same_device(
        op, q_nope=q_nope, q_pe=q_pe, ckv_cache=ckv_cache, kpe_cache=kpe_cache, sinks=sinks, **meta_tensors(meta)
    )
    if topk_indices is not None:
        check_topk_indices(op, topk_indices, t, q_nope.device)

    res = q_nope.new_empty(t, h, lkv)
    lse = torch.empty((t, h), dtype=torch.float32, device=q_nope.device) if return_lse else None
    if t == 0 or h == 0:
        return results(res, lse, return_lse)
    if topk_indices is not None:  # DSA: each row attends to the positions its index row lists
        dsa.sparse_mla_attention(
            q_nope,
            q_pe,
            ckv_cache,
            kpe_cache,
            meta,
            topk_indices,
            scale=scale,
            causal=causal,
            sinks=sinks,
            out=res,
            lse=lse,
            tuning=tuning,
        )
        return results(res, lse, return_lse)
    # one latent KV head shared by all H query heads: the GQA group is H; values are ckv itself
    launch(
        kernel=op,
        tuning=tuning,
        query=q_nope,
        q2=q_pe,
        key=ckv_cache[:, :, None],
        k2=kpe_cache[:, :, None],
        value=None,
        out=res,
        lse=lse,
        sinks=sinks,
        paged=True,
        table=meta.block_table,
        kv_lens=meta.seq_lens,
        cu_q=meta.query_start_loc,
        cu_k=None,
        batch=meta.num_seqs,
        num_kv_heads=1,
        longest_q=min(meta.max_query_len, t) or t,
        block_size=bs,
        scale=scale,
        causal=causal,
        window=(-1, -1),
        softcap=0.0,
    )
    return results(res, lse, return_lse)
