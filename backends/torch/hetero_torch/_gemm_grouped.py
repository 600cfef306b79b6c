"""The grouped matmul behind grouped_gemm, fused_moe and the quantized grouped GEMMs: torch's
``grouped_mm`` where it takes the dtype and device, else one padded batched matmul."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hetero_torch._gemm_packed import packed_grouped

__all__ = ["grouped_matmul", "row_groups", "used_groups"]

_GROUPED_MM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def row_groups(ends: torch.Tensor, rows: int) -> torch.Tensor:
    """The group of each of ``rows`` rows (int64 [rows]); rows past the last end get len(ends)."""
    return torch.searchsorted(ends.to(torch.int64), torch.arange(rows, device=ends.device), right=True)


def used_groups(
    b: torch.Tensor, b_scale: torch.Tensor, ends: list[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """(b, b_scale, group_ends tensor, ends) restricted to the groups that own rows, so that a
    dequantization widens only the weights in use (a decode step routes to few experts)."""
    starts = [0] + ends[:-1]
    keep = [g for g, (s, e) in enumerate(zip(starts, ends)) if e > s]
    if len(keep) == len(ends):
        return b, b_scale, torch.tensor(ends, dtype=torch.int32, device=b.device), ends
    index = torch.tensor(keep, dtype=torch.int64, device=b.device)
    kept = [ends[g] for g in keep]
    return (
        b.index_select(0, index),
        b_scale.index_select(0, index),
        torch.tensor(kept, dtype=torch.int32, device=b.device),
        kept,
    )


def _padded(a: torch.Tensor, b: torch.Tensor, ends_t: torch.Tensor, ends: list[int]) -> torch.Tensor:
    """a @ b[g].T per group as one bmm over [G, L, K] (L the largest group), in a's dtype; [ends[-1], N]."""
    used = ends[-1]
    starts = [0] + ends[:-1]
    longest = max(e - s for s, e in zip(starts, ends))
    group = row_groups(ends_t, used)
    offset = torch.arange(used, device=a.device) - torch.tensor(starts, device=a.device)[group]
    padded = a.new_zeros(b.shape[0], longest, a.shape[1])
    padded[group, offset] = a[:used]
    return torch.bmm(padded, b.transpose(1, 2))[group, offset]


def _fast(a: torch.Tensor, b: torch.Tensor, ends_t: torch.Tensor, wide: bool = False) -> torch.Tensor | None:
    """torch's grouped_mm in a's dtype, or float32 when ``wide`` (CUDA takes that for bfloat16; the CPU
    does not); None where it declines the inputs. Rows past the last end are undefined."""
    if a.dtype not in _GROUPED_MM_DTYPES or not hasattr(F, "grouped_mm"):
        return None
    try:
        return F.grouped_mm(
            a, b.transpose(1, 2), offs=ends_t.to(torch.int32), out_dtype=torch.float32 if wide else None
        )
    except (RuntimeError, NotImplementedError):
        return None  # a device or layout grouped_mm does not take


def grouped_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    ends_t: torch.Tensor,
    ends: list[int],
    out_dtype: torch.dtype,
    *,
    weights: bool = False,
) -> torch.Tensor:
    """Rows [ends[g-1], ends[g]) of ``a @ b[g].T`` accumulated in float32 or wider and rounded once to
    out_dtype; rows past ends[-1] are zero. a [M, K], b [G, N, K] of one dtype; ends_t its int tensor.
    ``weights``: b is a model weight, packed on first sight (else on its second)."""
    rows, n = a.shape[0], b.shape[1]
    used = ends[-1] if ends else 0
    if used == 0:
        return torch.zeros(rows, n, dtype=out_dtype, device=a.device)
    out = None
    if out_dtype != a.dtype and a.dtype not in (torch.float32, torch.float64):
        out = _fast(a, b, ends_t, wide=True)
        if out is None:
            a, b = a.float(), b.float()  # one rounding, to out_dtype
    if out is None and out_dtype == a.dtype:
        out = packed_grouped(a, b, ends, first_sight=weights)  # CPU: faster than grouped_mm's GEMM per group
    out = _fast(a, b, ends_t) if out is None else out
    if out is not None:
        out = out.to(out_dtype)
        if used < rows:
            out[used:] = 0
        return out
    out = torch.zeros(rows, n, dtype=out_dtype, device=a.device)
    out[:used] = _padded(a, b, ends_t, ends).to(out_dtype)
    return out
