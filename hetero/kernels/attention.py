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
query row and block of heads gathering the listed positions: ``hetero.kernels.dsa``.

Tuning entries ("paged_attention", "varlen_attention", "mla_attention"): ``BLOCK_M``
(flattened rows per program; shrunk to the batch's longest query times G when that is
smaller, never below 16), ``BLOCK_N`` (keys per step), ``num_warps``, ``num_stages``.
Under the interpreter, bf16 operands of ``tl.dot`` are upcast to float32 (the interpreter
of triton 3.9 returns garbage for a bf16 dot). Float32 dots run at IEEE precision (no
TF32), so a float32 call is as accurate as float32 arithmetic.
"""
from __future__ import annotations

import math
import numbers
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
from hetero.kernels._attention_kernels import attention_fwd_kernel  # noqa: E402

__all__ = ["paged_attention", "varlen_attention", "mla_attention"]

#: Activation dtypes the kernels take (float64, the oracle's, has no tensor-core dot).
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_STAT_DTYPES = (torch.float32, torch.float64)


# ----------------------------------------------------------------------------- checks


def _real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _check_options(op: str, scale: object, causal: object, window: object, softcap: object, return_lse: object) -> tuple[float, tuple[int, int], float]:
    expect(_real(scale) and math.isfinite(scale), op, "scale", "a finite float", repr(scale))
    expect(isinstance(causal, bool), op, "causal", "a bool", repr(causal))
    expect(isinstance(return_lse, bool), op, "return_lse", "a bool", repr(return_lse))
    pair = isinstance(window, (tuple, list)) and len(window) == 2
    expect(pair and all(_int(w) for w in window), op, "window", "a pair of ints (left, right)", repr(window))
    expect(min(window) >= -1, op, "window", "sizes >= 0, or -1 for unbounded", repr(window))
    expect(_real(softcap) and math.isfinite(softcap) and softcap >= 0, op, "softcap", "a finite float >= 0 (0 disables)", repr(softcap))
    return float(scale), (int(window[0]), int(window[1])), float(softcap)


def _check_gqa(op: str, arg: str, hq: int, hkv: int) -> None:
    expect(hkv >= 1, op, arg, "at least one KV head", hkv)
    expect(hq % hkv == 0, op, arg, f"a KV head count dividing the query head count {hq}", f"{hkv} KV heads")


def _check_out(op: str, out: torch.Tensor | None, shape: tuple[int, ...], like: torch.Tensor) -> None:
    if out is not None:
        check_tensor(op, "out", out, shape=shape, dtypes=(like.dtype,))
        expect(out.device == like.device, op, "out", f"device {like.device} (that of the query)", out.device)


# ----------------------------------------------------------------------------- launch


def _pow2(n: int, least: int = 16) -> int:
    """The next power of two >= n, at least ``least`` (tl.dot needs 16 on every dimension)."""
    return max(least, triton.next_power_of_2(max(int(n), 1)))


def _params(tuning: Tuning, kernel: str, longest_rows: int) -> tuple[int, int, dict[str, Any]]:
    """(BLOCK_M, BLOCK_N, launch options): BLOCK_M shrinks to the longest sequence's flattened
    rows when that is smaller (decode), never below 16."""
    meta, launch = Tuning.launch_options(tuning(kernel))
    block_m = _pow2(meta.get("BLOCK_M", 16))
    block_n = _pow2(meta.get("BLOCK_N", 32))
    block_m = min(block_m, _pow2(longest_rows))
    return block_m, block_n, launch


def _tile_table(cu_q: torch.Tensor, batch: int, total: int, group: int, block_m: int, longest: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(tile_seq, tile_start) int32 [grid]: tile t covers flattened rows [start, start + BLOCK_M)
    of sequence tile_seq[t]; -1 for the grid's spare tiles. Device-side, no host sync."""
    dev = cu_q.device
    counts = (cu_q[1:] - cu_q[:-1]).to(torch.int64).clamp_(min=0)  # decreasing cu_q: no tiles, not a broken search
    per = (counts * group + block_m - 1) // block_m
    ends = torch.cumsum(per, 0)
    grid = -(-total * group // block_m) + batch
    if longest is not None:  # each sequence has at most ceil(longest * G / BLOCK_M) tiles
        grid = min(grid, batch * -(-longest * group // block_m))
    pid = torch.arange(grid, device=dev, dtype=torch.int64)
    seq = torch.searchsorted(ends, pid, right=True)
    valid = seq < batch
    seq_c = seq.clamp(max=batch - 1)
    first = ends[seq_c] - per[seq_c]
    tile_seq = torch.where(valid, seq, -1).to(torch.int32)
    tile_start = torch.where(valid, (pid - first) * block_m, 0).to(torch.int32)
    return tile_seq, tile_start


def _launch(
    *, kernel: str, tuning: Tuning, query: torch.Tensor, q2: torch.Tensor | None, key: torch.Tensor, k2: torch.Tensor | None,
    value: torch.Tensor | None, out: torch.Tensor, lse: torch.Tensor | None, sinks: torch.Tensor | None,
    paged: bool, table: torch.Tensor | None, kv_lens: torch.Tensor | None, cu_q: torch.Tensor, cu_k: torch.Tensor | None,
    batch: int, num_kv_heads: int, longest_q: int, block_size: int, scale: float, causal: bool, window: tuple[int, int],
    softcap: float,
) -> None:
    """key/k2/value as 4-D [blocks, slots, heads, dim] views (paged) or [rows, 1, heads, dim] (dense)."""
    t, hq, d = query.shape
    group = hq // num_kv_heads
    dv = out.shape[2]
    d2 = q2.shape[2] if q2 is not None else 0
    cu_q, cu_k, kv_lens = (x.contiguous() if x is not None else None for x in (cu_q, cu_k, kv_lens))  # [B+1] / [B]: no-ops in practice
    block_m, block_n, launch = _params(tuning, kernel, longest_q * group)
    tile_seq, tile_start = _tile_table(cu_q, batch, t, group, block_m, longest_q)
    if tile_seq.numel() == 0:
        return
    q2_, k2_ = (q2, k2) if q2 is not None else (query, key)
    v_ = value if value is not None else key
    lse_ = lse if lse is not None else tile_seq[:, None]  # unused (RETURN_LSE=False): any 2-D tensor
    upcast = tuning.interpreted and query.dtype == torch.bfloat16
    attention_fwd_kernel[(tile_seq.shape[0], num_kv_heads)](
        query, q2_, key, k2_, v_, out, lse_, sinks if sinks is not None else query,
        table if table is not None else cu_q, kv_lens if kv_lens is not None else cu_q,
        cu_q, cu_k if cu_k is not None else cu_q, tile_seq, tile_start,
        *query.stride(), *q2_.stride(),
        key.stride(0), key.stride(1), key.stride(2), key.stride(3),
        k2_.stride(0), k2_.stride(1), k2_.stride(2), k2_.stride(3),
        v_.stride(0), v_.stride(1), v_.stride(2), v_.stride(3),
        *out.stride(), lse_.stride(0), lse_.stride(1), *(table.stride() if table is not None else (0, 0)),
        scale, softcap if softcap > 0 else 1.0, window[0], window[1],
        t, key.shape[0], table.shape[1] * block_size if table is not None else 0,
        GROUP=group, BS=block_size, D=d, D2=max(d2, 1), DV=dv, D_P=_pow2(d), D2_P=_pow2(d2), DV_P=_pow2(dv),
        PAGED=paged, HAS_PE=q2 is not None, V_IS_K=value is None,
        CAUSAL=causal, HAS_WL=window[0] >= 0, HAS_WR=window[1] >= 0,
        HAS_SOFTCAP=softcap > 0, HAS_SINKS=sinks is not None, RETURN_LSE=lse is not None,
        UPCAST=upcast, DOT_PREC="ieee",
        BLOCK_M=block_m, BLOCK_N=block_n, **launch,
    )


def _results(out: torch.Tensor, lse: torch.Tensor | None, return_lse: bool) -> Any:
    return (out, lse) if return_lse else out


# ----------------------------------------------------------------------------- ops


def paged_attention(
    query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMeta, *, scale: float, causal: bool = True,
    window: tuple[int, int] = (-1, -1), softcap: float = 0.0, sinks: torch.Tensor | None = None, out: torch.Tensor | None = None,
    return_lse: bool = False, tuning: Tuning,
) -> Any:
    op = "paged_attention"
    scale, window, softcap = _check_options(op, scale, causal, window, softcap, return_lse)
    check_tensor(op, "query", query, ndim=3, dtypes=KERNEL_DTYPES)
    t, hq, d = query.shape
    dt = (query.dtype,)
    check_tensor(op, "k_cache", k_cache, shape=(None, None, None, d), dtypes=dt)
    nb, bs, hkv = k_cache.shape[:3]
    check_tensor(op, "v_cache", v_cache, shape=(nb, bs, hkv, None), dtypes=dt)
    expect(bs >= 1, op, "k_cache", "a block size >= 1", f"shape {list(k_cache.shape)}")
    _check_gqa(op, "k_cache", hq, hkv)
    if sinks is not None:
        check_tensor(op, "sinks", sinks, shape=(hq,), dtypes=_STAT_DTYPES)
    shape = (t, hq, v_cache.shape[3])
    _check_out(op, out, shape, query)
    meta = check_meta_shapes(op, meta, t)
    check_same_device(op, query=query, k_cache=k_cache, v_cache=v_cache, sinks=sinks, **meta_tensors(meta))

    res = out if out is not None else query.new_empty(shape)
    lse = torch.empty((t, hq), dtype=torch.float32, device=query.device) if return_lse else None
    if t == 0 or hq == 0:
        return _results(res, lse, return_lse)
    _launch(kernel=op, tuning=tuning, query=query, q2=None, key=k_cache, k2=None, value=v_cache, out=res, lse=lse, sinks=sinks,
            paged=True, table=meta.block_table, kv_lens=meta.seq_lens, cu_q=meta.query_start_loc, cu_k=None,
            batch=meta.num_seqs, num_kv_heads=hkv, longest_q=min(meta.max_query_len, t) or t, block_size=bs,
            scale=scale, causal=causal, window=window, softcap=softcap)
    return _results(res, lse, return_lse)


def varlen_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int, max_seqlen_k: int, *, scale: float, causal: bool = True, window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0, return_lse: bool = False, tuning: Tuning,
) -> Any:
    op = "varlen_attention"
    scale, window, softcap = _check_options(op, scale, causal, window, softcap, return_lse)
    check_tensor(op, "query", query, ndim=3, dtypes=KERNEL_DTYPES)
    (tq, hq, d), dt = query.shape, (query.dtype,)
    check_tensor(op, "key", key, shape=(None, None, d), dtypes=dt)
    tk, hkv = key.shape[:2]
    check_tensor(op, "value", value, shape=(tk, hkv, None), dtypes=dt)
    _check_gqa(op, "key", hq, hkv)
    check_tensor(op, "cu_seqlens_q", cu_seqlens_q, ndim=1, dtypes=INDEX_DTYPES)
    batch = cu_seqlens_q.shape[0] - 1
    expect(batch >= 0, op, "cu_seqlens_q", "at least one entry", "none")
    check_tensor(op, "cu_seqlens_k", cu_seqlens_k, shape=(batch + 1,), dtypes=INDEX_DTYPES)
    for name, v in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        expect(_int(v) and v >= 0, op, name, "an int >= 0", repr(v))
    check_same_device(op, query=query, key=key, value=value, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)

    res = query.new_empty(tq, hq, value.shape[2])
    lse = torch.empty((tq, hq), dtype=torch.float32, device=query.device) if return_lse else None
    if tq == 0 or hq == 0:
        return _results(res, lse, return_lse)
    expect(batch >= 1, op, "cu_seqlens_q", f"at least one sequence for {tq} tokens", "none")
    _launch(kernel=op, tuning=tuning, query=query, q2=None, key=key[:, None], k2=None, value=value[:, None], out=res, lse=lse,
            sinks=None, paged=False, table=None, kv_lens=None, cu_q=cu_seqlens_q, cu_k=cu_seqlens_k,
            batch=batch, num_kv_heads=hkv, longest_q=min(max_seqlen_q, tq) or tq, block_size=1,
            scale=scale, causal=causal, window=window, softcap=softcap)
    return _results(res, lse, return_lse)


def mla_attention(
    q_nope: torch.Tensor, q_pe: torch.Tensor, ckv_cache: torch.Tensor, kpe_cache: torch.Tensor, meta: AttentionMeta, *,
    scale: float, causal: bool = True, return_lse: bool = False, topk_indices: torch.Tensor | None = None, tuning: Tuning,
) -> Any:
    op = "mla_attention"
    scale, _, _ = _check_options(op, scale, causal, (-1, -1), 0.0, return_lse)
    t, h, lkv, nb, bs = check_mla_inputs(op, q_nope, q_pe, ckv_cache, kpe_cache, KERNEL_DTYPES)
    meta = check_meta_shapes(op, meta, t)
    check_same_device(op, q_nope=q_nope, q_pe=q_pe, ckv_cache=ckv_cache, kpe_cache=kpe_cache, **meta_tensors(meta))
    if topk_indices is not None:
        check_topk_indices(op, topk_indices, t, q_nope.device)

    res = q_nope.new_empty(t, h, lkv)
    lse = torch.empty((t, h), dtype=torch.float32, device=q_nope.device) if return_lse else None
    if t == 0 or h == 0:
        return _results(res, lse, return_lse)
    if topk_indices is not None:  # DSA: each row attends to the positions its index row lists
        dsa.sparse_mla_attention(q_nope, q_pe, ckv_cache, kpe_cache, meta, topk_indices, scale=scale, causal=causal,
                                 out=res, lse=lse, tuning=tuning)
        return _results(res, lse, return_lse)
    # one latent KV head shared by all H query heads: the GQA group is H; values are ckv itself
    _launch(kernel=op, tuning=tuning, query=q_nope, q2=q_pe, key=ckv_cache[:, :, None], k2=kpe_cache[:, :, None], value=None,
            out=res, lse=lse, sinks=None, paged=True, table=meta.block_table, kv_lens=meta.seq_lens,
            cu_q=meta.query_start_loc, cu_k=None, batch=meta.num_seqs, num_kv_heads=1,
            longest_q=min(meta.max_query_len, t) or t, block_size=bs, scale=scale, causal=causal, window=(-1, -1), softcap=0.0)
    return _results(res, lse, return_lse)
