"""Argument checks and the launch of the attention kernel, shared by ``hetero.kernels.attention``'s three ops."""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch

from hetero.kernels._triton import triton_modules
from hetero.kernels.tuning import Tuning
from hetero.spec.checks import check_tensor, expect

triton, tl = triton_modules()

from hetero.kernels._attention_kernels import attention_fwd_kernel  # noqa: E402  (after Triton is set up)

#: Activation dtypes the kernels take (float64, the oracle's, has no tensor-core dot).
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
STAT_DTYPES = (torch.float32, torch.float64)

# ----------------------------------------------------------------------------- checks


def is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def is_int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def check_options(
    op: str, scale: object, causal: object, window: object, softcap: object, return_lse: object
) -> tuple[float, tuple[int, int], float]:
    expect(is_real(scale) and math.isfinite(scale), op, "scale", "a finite float", repr(scale))
    expect(isinstance(causal, bool), op, "causal", "a bool", repr(causal))
    expect(isinstance(return_lse, bool), op, "return_lse", "a bool", repr(return_lse))
    pair = isinstance(window, (tuple, list)) and len(window) == 2
    expect(pair and all(is_int(w) for w in window), op, "window", "a pair of ints (left, right)", repr(window))
    expect(min(window) >= -1, op, "window", "sizes >= 0, or -1 for unbounded", repr(window))
    expect(
        is_real(softcap) and math.isfinite(softcap) and softcap >= 0,
        op,
        "softcap",
        "a finite float >= 0 (0 disables)",
        repr(softcap),
    )
    return float(scale), (int(window[0]), int(window[1])), float(softcap)


def check_gqa(op: str, arg: str, hq: int, hkv: int) -> None:
    expect(hkv >= 1, op, arg, "at least one KV head", hkv)
    expect(hq % hkv == 0, op, arg, f"a KV head count dividing the query head count {hq}", f"{hkv} KV heads")


def check_out(op: str, out: torch.Tensor | None, shape: tuple[int, ...], like: torch.Tensor) -> None:
    if out is not None:
        check_tensor(op, "out", out, shape=shape, dtypes=(like.dtype,))
        expect(out.device == like.device, op, "out", f"device {like.device} (that of the query)", out.device)


# ----------------------------------------------------------------------------- launch


def pow2(n: int, least: int = 16) -> int:
    """The next power of two >= n, at least ``least`` (tl.dot needs 16 on every dimension)."""
    return max(least, triton.next_power_of_2(max(int(n), 1)))


def launch_params(tuning: Tuning, kernel: str, longest_rows: int) -> tuple[int, int, dict[str, Any]]:
    """(BLOCK_M, BLOCK_N, launch options): BLOCK_M shrinks to the longest sequence's flattened
    rows when that is smaller (decode), never below 16."""
    meta, launch = Tuning.launch_options(tuning(kernel))
    block_m = pow2(meta.get("BLOCK_M", 16))
    block_n = pow2(meta.get("BLOCK_N", 32))
    block_m = min(block_m, pow2(longest_rows))
    return block_m, block_n, launch


def tile_table(
    cu_q: torch.Tensor, batch: int, total: int, group: int, block_m: int, longest: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
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


def launch(
    *,
    kernel: str,
    tuning: Tuning,
    query: torch.Tensor,
    q2: torch.Tensor | None,
    key: torch.Tensor,
    k2: torch.Tensor | None,
    value: torch.Tensor | None,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    sinks: torch.Tensor | None,
    paged: bool,
    table: torch.Tensor | None,
    kv_lens: torch.Tensor | None,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor | None,
    batch: int,
    num_kv_heads: int,
    longest_q: int,
    block_size: int,
    scale: float,
    causal: bool,
    window: tuple[int, int],
    softcap: float,
) -> None:
    """key/k2/value as 4-D [blocks, slots, heads, dim] views (paged) or [rows, 1, heads, dim] (dense)."""
    t, hq, d = query.shape
    group = hq // num_kv_heads
    dv = out.shape[2]
    d2 = q2.shape[2] if q2 is not None else 0
    cu_q, cu_k, kv_lens = (
        x.contiguous() if x is not None else None for x in (cu_q, cu_k, kv_lens)
    )  # [B+1] / [B]: no-ops in practice
    block_m, block_n, launch = launch_params(tuning, kernel, longest_q * group)
    tile_seq, tile_start = tile_table(cu_q, batch, t, group, block_m, longest_q)
    if tile_seq.numel() == 0:
        return
    q2_, k2_ = (q2, k2) if q2 is not None else (query, key)
    v_ = value if value is not None else key
    lse_ = lse if lse is not None else tile_seq[:, None]  # unused (RETURN_LSE=False): any 2-D tensor
    upcast = tuning.interpreted and query.dtype == torch.bfloat16
    attention_fwd_kernel[(tile_seq.shape[0], num_kv_heads)](
        query, q2_, key, k2_, v_, out, lse_, sinks.contiguous() if sinks is not None else query,
        table if table is not None else cu_q, kv_lens if kv_lens is not None else cu_q,
        cu_q, cu_k if cu_k is not None else cu_q, tile_seq, tile_start,
        *query.stride(), *q2_.stride(),
        key.stride(0), key.stride(1), key.stride(2), key.stride(3),
        k2_.stride(0), k2_.stride(1), k2_.stride(2), k2_.stride(3),
        v_.stride(0), v_.stride(1), v_.stride(2), v_.stride(3),
        *out.stride(), lse_.stride(0), lse_.stride(1), *(table.stride() if table is not None else (0, 0)),
        scale, softcap if softcap > 0 else 1.0, window[0], window[1],
        t, key.shape[0], table.shape[1] * block_size if table is not None else 0,
        GROUP=group, BS=block_size, D=d, D2=max(d2, 1), DV=dv, D_P=pow2(d), D2_P=pow2(d2), DV_P=pow2(dv),
        PAGED=paged, HAS_PE=q2 is not None, V_IS_K=value is None,
        CAUSAL=causal, HAS_WL=window[0] >= 0, HAS_WR=window[1] >= 0,
        HAS_SOFTCAP=softcap > 0, HAS_SINKS=sinks is not None, RETURN_LSE=lse is not None,
        UPCAST=upcast, DOT_PREC="ieee",
        BLOCK_M=block_m, BLOCK_N=block_n, **launch,
    )  # fmt: skip


def results(out: torch.Tensor, lse: torch.Tensor | None, return_lse: bool) -> Any:
    return (out, lse) if return_lse else out


# ----------------------------------------------------------------------------- ops
