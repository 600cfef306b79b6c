"""Triton compressed_attention (spec 1.8, DeepSeek-V4): a sliding window of raw K=V rows and the
compressed entries (all visible ones, HCA, or a top-k list, CSA) in one online softmax with sinks.

Semantics: ``hetero.spec.compressed``; the kernel is ``_compressed_attention_kernels``. This module
runs the cheap checks (no host read), computes each query row's (sequence, position) on the device
and launches one grid of (T, ceil(H / BLOCK_H)) programs: each walks its row's window and then its
compressed entries, so both sources share one softmax and the single K=V head's rows are read once
for all ``BLOCK_H`` heads of the program.

Tuning entry "compressed_attention": ``BLOCK_H`` (heads per program, >= 16), ``BLOCK_N`` (keys per
tile), ``num_warps``; the defaults below are those of the sparse MLA kernel, whose tiles are of the
same size (D = 512). Under the interpreter, bf16 dot operands are upcast to float32.
"""

from __future__ import annotations

from typing import Any

import torch

from hetero.kernels._compressed_attention_kernels import compressed_attention_kernel
from hetero.kernels._meta import row_positions
from hetero.kernels._rounding import rne_bf16
from hetero.kernels._triton import triton_modules
from hetero.kernels.tuning import Tuning
from hetero.spec.checks import check_compressed_attention
from hetero.spec.types import AttentionMeta

triton, tl = triton_modules()

__all__ = ["compressed_attention"]

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_DEFAULTS = {"BLOCK_H": 16, "BLOCK_N": 16, "num_warps": 4}
_INTERPRETED = {"BLOCK_H": 128, "BLOCK_N": 128}


def _pow2(n: int, least: int = 16) -> int:
    return max(least, triton.next_power_of_2(max(int(n), 1)))


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
    tuning: Tuning,
) -> Any:
    """``out`` [T, H, D] in the query's dtype (and ``lse`` float32 [T, H], sinks excluded)."""
    op = "compressed_attention"
    t, h, d, nb, bs, nbc, bsc = check_compressed_attention(
        op,
        query,
        kv_cache,
        comp_cache,
        meta,
        comp_block_table,
        scale,
        window,
        ratio,
        sinks,
        topk_indices,
        return_lse,
        KERNEL_DTYPES,
    )
    out = query.new_empty(t, h, d)
    lse = torch.empty((t, h), dtype=torch.float32, device=query.device) if return_lse else None
    if t == 0 or h == 0:
        return (out, lse) if return_lse else out
    params = {**_DEFAULTS, **(_INTERPRETED if tuning.interpreted else {}), **tuning(op)}
    meta_p, launch = Tuning.launch_options(params)
    block_h = min(_pow2(meta_p["BLOCK_H"]), _pow2(h))
    seq, pos = row_positions(meta, t)
    table = meta.block_table
    lse_: Any = lse if lse is not None else out[:, :, 0]  # never written without RETURN_LSE
    idx: Any = topk_indices if topk_indices is not None else seq
    idx_strides = topk_indices.stride() if topk_indices is not None else (0, 0)
    topk = topk_indices.shape[1] if topk_indices is not None else 0
    compressed_attention_kernel[(t, triton.cdiv(h, block_h))](
        query, kv_cache, comp_cache, table, comp_block_table, idx, seq, pos, out, lse_,
        sinks.contiguous() if sinks is not None else lse_,
        *query.stride(), *kv_cache.stride(), *comp_cache.stride(), *table.stride(), *comp_block_table.stride(),
        *idx_strides, *out.stride(), *lse_.stride(),
        h, nb, table.shape[1], nbc, comp_block_table.shape[1], int(window), int(ratio), topk, float(scale),
        BS=bs, BSC=bsc, D=d, D_P=_pow2(d), HAS_TOPK=topk_indices is not None, RETURN_LSE=lse is not None,
        HAS_SINKS=sinks is not None, UPCAST=tuning.interpreted and query.dtype == torch.bfloat16,
        RNE_BF16=rne_bf16(out.dtype, tuning), DOT_PREC="ieee", BLOCK_H=block_h,
        BLOCK_N=min(_pow2(meta_p["BLOCK_N"]), _pow2(max(int(window), topk))), **launch,
    )  # fmt: skip
    return (out, lse) if return_lse else out
