"""Matrix multiplication: dense, quantized (fp8/int8 with scales) and grouped.

Weights are in nn.Linear layout, ``[N, K]``: every op computes ``a @ b.T``.
Accumulation is at least float32 (exact int32 for int8).
"""
from __future__ import annotations

import torch

from hetero.spec._op import spec_op

__all__ = ["gemm", "scaled_gemm", "grouped_gemm", "SCALE_BLOCK"]

#: Block edge of the block-wise scales of ``scaled_gemm`` (DeepSeek-V3's 128x128 weights, 1x128 activations).
SCALE_BLOCK = 128


@spec_op(returns=("out",))
def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``a @ b.T + bias``.

    a [M, K], b [N, K] of one floating dtype; bias [N] or None. Returns [M, N] in
    ``out_dtype`` (default: a's dtype). M may be 0.
    """


@spec_op(returns=("out",))
def scaled_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """Quantized ``dequant(a) @ dequant(b).T + bias``.

    a [M, K], b [N, K] of one quantized dtype: float8_e4m3fn, float8_e4m3fnuz
    (AMD MI300) or int8. Scales are float32 and each operand's shape says its form:

    - per tensor: one element (shape [], [1] or [1, 1]);
    - a_scale [M, 1] per token, b_scale [N, 1] per output channel;
    - block-wise (DeepSeek-V3): a_scale [M, ceil(K/128)], one per token and 128
      columns; b_scale [ceil(N/128), ceil(K/128)], one per 128x128 tile.

    ``dequant(a)[m, k] = a[m, k] * a_scale[...]`` at the entry that covers (m, k),
    likewise for b; the two forms may be mixed. bias [N] (float32 or out_dtype) is
    added after scaling. Returns [M, N] in out_dtype (bfloat16, float16 or float32).
    """


@spec_op(returns=("out",))
def grouped_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    group_ends: torch.Tensor,
    *,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """One GEMM per group of consecutive rows: rows of group g use weight b[g].

    a [M, K], b [G, N, K] of one floating dtype; group_ends int32 [G],
    non-decreasing, each in [0, M]: group g owns rows
    ``[group_ends[g-1], group_ends[g])`` (group -1 ends at 0). An empty group is
    legal; rows past ``group_ends[-1]`` are zero in the output. Returns [M, N] in
    ``out_dtype`` (default: a's dtype).
    """
