"""Triton DSA (DeepSeek sparse attention): indexer_topk and the sparse path of mla_attention.

Semantics: ``hetero.spec.attention``. The kernels are in ``_indexer_kernels`` and
``_sparse_mla_kernel``; this module validates the cheap things and launches them.

indexer_topk, launch shape (what a GPU runs): the query rows are processed in chunks of
``rows = max(1, WORKSPACE // width)`` rows, ``width = min(max_seq_len, table columns * BS)``, so
the op's int32 score workspace [rows, width] never exceeds ``WORKSPACE`` entries (2**25, 128 MiB,
by default) whatever T and the context length. Per chunk, two launches: the scores (grid
rows x ceil(width / SPAN), each program one row's span of keys) and the selection (one program
per row: a radix select of 4 histogram passes over its keys when it keeps fewer than it sees,
then one writing pass; see ``_indexer_kernels``).
The scores never leave the op; the result is int32 [T, topk], in increasing position order.
With ``compress_ratio`` m > 1 (spec 1.8) the cache holds compressed entries: the launcher hands the
kernels each row's last visible entry ``(pos + 1) // m - 1`` as its position and ``seq_lens // m``
as the key counts, and the workspace is ``min(max_seq_len // m, columns * BS)`` wide.

sparse mla_attention: grid (T, ceil(H / BLOCK_H)); see ``_sparse_mla_kernel``.

Tuning entries ("indexer_topk": ``SPAN``, ``BLOCK_N``, ``FP8_BLOCK_N``, ``SELECT_BLOCK``, ``WORKSPACE``;
"mla_sparse": ``BLOCK_H``, ``BLOCK_N``; both with ``num_warps``) fall back to the defaults below.
Under the interpreter, bf16 dot operands are upcast to float32 (see ``attention``).
"""

from __future__ import annotations

import numbers
from typing import Any

import torch

from hetero.kernels import _indexer_kernels as ik
from hetero.kernels._meta import row_positions
from hetero.kernels._rounding import rne_bf16
from hetero.kernels._sparse_mla_kernel import sparse_mla_kernel
from hetero.kernels._triton import triton_modules
from hetero.kernels.tuning import Tuning
from hetero.spec._checks_dsa import check_indexer_inputs
from hetero.spec._checks_meta import check_meta_shapes
from hetero.spec.checks import check_tensor, expect

triton, tl = triton_modules()

__all__ = ["indexer_topk", "sparse_mla_attention"]

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: Portable defaults: shared memory under 64 KiB (AMD's LDS) at Hi 64, D 128 (fp8 keys dequantize to float32 tiles).
_INDEXER = {"SPAN": 2048, "BLOCK_N": 32, "FP8_BLOCK_N": 16, "SELECT_BLOCK": 1024, "WORKSPACE": 1 << 25, "num_warps": 4}
_INDEXER_INTERPRETED = {"SPAN": 1 << 20, "BLOCK_N": 512, "FP8_BLOCK_N": 512, "SELECT_BLOCK": 1 << 16}
_SPARSE = {"BLOCK_H": 16, "BLOCK_N": 16, "num_warps": 4}
_SPARSE_INTERPRETED = {"BLOCK_H": 128, "BLOCK_N": 256}


def _pow2(n: int, least: int = 16) -> int:
    return max(least, triton.next_power_of_2(max(int(n), 1)))


def _params(tuning: Tuning, kernel: str, base: dict, interpreted: dict) -> tuple[dict, dict]:
    params = {**base, **(interpreted if tuning.interpreted else {}), **tuning(kernel)}
    return Tuning.launch_options(params)


def _indexer_tiles(tuning: Tuning, width: int, rows: int, fp8: bool) -> tuple[int, int, int, int, dict]:
    """(SPAN, BLOCK_N, SELECT_BLOCK, rows per chunk, launch options): tiles no longer than the rows
    (the interpreter's are huge), chunks whose workspace stays under WORKSPACE entries."""
    meta_p, launch = _params(tuning, "indexer_topk", _INDEXER, _INDEXER_INTERPRETED)
    span = min(_pow2(meta_p["SPAN"]), _pow2(width))
    block_n = min(_pow2(meta_p["FP8_BLOCK_N" if fp8 else "BLOCK_N"]), span)
    select = min(_pow2(meta_p["SELECT_BLOCK"]), _pow2(width))
    return span, block_n, select, max(1, min(rows, int(meta_p["WORKSPACE"]) // width)), launch


def indexer_topk(
    q, weights, index_cache, meta, *, topk, index_scale=None, compress_ratio=1, tuning: Tuning
) -> torch.Tensor:
    op = "indexer_topk"
    t, hi, d, nb, bs, topk = check_indexer_inputs(op, q, weights, index_cache, meta, topk, index_scale, compress_ratio)
    m = int(compress_ratio)
    check_tensor(op, "q", q, dtypes=KERNEL_DTYPES)  # float64 is the reference's
    meta = check_meta_shapes(op, meta, t)
    longest = meta.max_seq_len
    expect(
        isinstance(longest, numbers.Integral) and not isinstance(longest, bool) and longest >= 0,
        op,
        "meta.max_seq_len",
        "an int >= 0",
        repr(longest),
    )
    out = torch.empty((t, topk), dtype=torch.int32, device=q.device)
    table, seq_lens = meta.block_table, meta.seq_lens
    keys = table.shape[1] * bs  # no row sees past its table
    width = min(int(longest) // m, keys)
    if t == 0 or width == 0:
        return out.fill_(-1)
    fp8 = index_scale is not None
    span, block_n, select, chunk, launch = _indexer_tiles(tuning, width, t, fp8)
    ws = torch.empty((chunk, width), dtype=torch.int32, device=q.device)  # the scores, as order-preserving int32 keys
    seq, pos = row_positions(meta, t)
    if m > 1:  # the kernels' rule j <= pos over seq_lens keys, in compressed entries (spec 1.8)
        pos, seq_lens = torch.div(pos + 1, m, rounding_mode="floor") - 1, torch.div(seq_lens, m, rounding_mode="floor")
    cache = index_cache.view(torch.uint8) if fp8 else index_cache
    scale, ss = (index_scale, index_scale.stride()) if fp8 else (weights, (0, 0, 0))
    for row0 in range(0, t, chunk):
        rows = min(chunk, t - row0)
        ik.indexer_score_kernel[(rows, triton.cdiv(width, span))](
            q, weights, cache, scale, table, seq, pos, seq_lens, ws, row0, hi, nb, keys, width,
            *q.stride(), *weights.stride(), *cache.stride(), *ss, *table.stride(), ws.stride(0),
            BS=bs, D=d, D_P=_pow2(d), HI_P=_pow2(hi), FP8=fp8, UPCAST=tuning.interpreted and q.dtype == torch.bfloat16,
            DOT_PREC="ieee", SPAN=span, BLOCK_N=block_n, **launch,
        )  # fmt: skip
        ik.indexer_select_kernel[(rows,)](ws, out, seq, pos, seq_lens, row0, keys, width, topk,
                                          ws.stride(0), *out.stride(), BLOCK=select, **launch)  # fmt: skip
    return out


def sparse_mla_attention(
    q_nope,
    q_pe,
    ckv_cache,
    kpe_cache,
    meta,
    topk_indices,
    *,
    scale: float,
    causal: bool,
    sinks: torch.Tensor | None = None,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    tuning: Tuning,
) -> None:
    """Sparse absorbed MLA into ``out`` [T, H, Lkv] (and ``lse`` [T, H]), with optional ``sinks`` [H]; the
    caller checked every shape."""
    t, h, lkv = q_nope.shape
    nb, bs = ckv_cache.shape[:2]
    r = q_pe.shape[2]
    table = meta.block_table
    meta_p, launch = _params(tuning, "mla_sparse", _SPARSE, _SPARSE_INTERPRETED)
    block_h = min(_pow2(meta_p["BLOCK_H"]), _pow2(h))
    seq, pos = row_positions(meta, t)
    lse_: Any = lse if lse is not None else out[:, :, 0]
    sparse_mla_kernel[(t, triton.cdiv(h, block_h))](
        q_nope, q_pe, ckv_cache, kpe_cache, topk_indices, table, seq, pos, meta.seq_lens, out, lse_,
        sinks.contiguous() if sinks is not None else lse_,
        *q_nope.stride(), *q_pe.stride(), *ckv_cache.stride(), *kpe_cache.stride(),
        *topk_indices.stride(), *table.stride(), *out.stride(), *lse_.stride(),
        h, nb, table.shape[1] * bs, topk_indices.shape[1], float(scale),
        BS=bs, LKV=lkv, R=r, LKV_P=_pow2(lkv), R_P=_pow2(r), CAUSAL=causal, RETURN_LSE=lse is not None,
        HAS_SINKS=sinks is not None,
        UPCAST=tuning.interpreted and q_nope.dtype == torch.bfloat16, RNE_BF16=rne_bf16(out.dtype, tuning),
        DOT_PREC="ieee", BLOCK_H=block_h, BLOCK_N=min(_pow2(meta_p["BLOCK_N"]), _pow2(topk_indices.shape[1])), **launch,
    )  # fmt: skip
