"""Matrix multiplication: dense, quantized (fp8/int8 with scales), packed int4 weights, and grouped.

Weights are in nn.Linear layout, ``[N, K]``: every op computes ``a @ b.T``.
Accumulation is at least float32 (exact int32 for int8).

Packed int4 weights (spec 1.9, W4A16: weight-only, the activations stay float). A logical
weight of 4-bit codes ``q[n, k]`` in [0, 15] is a uint8 tensor ``[..., N, ceil(K/2)]``, two
codes a byte along K, the even column in the low nibble::

    q[n, 2j]     = b[n, j] & 0xF
    q[n, 2j + 1] = b[n, j] >> 4           # ignored past K (the last byte's high nibble when K is odd)

(a compressed-tensors ``pack-quantized`` int32 tensor viewed as uint8 on a little-endian host is
exactly this). Scales are float32 ``[..., N, ceil(K/g)]`` with ``group_size`` g (32, 64 and 128 in
released checkpoints; any positive int), one per row and group of g consecutive columns, the last
group partial when g does not divide K. Zero points are uint8 of the scales' shape with values in
[0, 15], or None, which means 8 (symmetric). Dequantization is bit-exact by contract::

    w[n, k] = float32(q[n, k] - zp[n, k // g]) * scale[n, k // g]     # one float32 rounding

and the product is then ``a @ w.T`` accumulated in float32 or wider, as for float weights.
"""

from __future__ import annotations

import torch

from hetero.spec._op import Output, spec_op

__all__ = [
    "gemm",
    "scaled_gemm",
    "grouped_gemm",
    "quantize_activation",
    "scaled_grouped_gemm",
    "SCALE_BLOCK",
    "QMAX",
    "SCALE_FORMATS",
    "AMAX_FLOOR",
]

#: Block edge of the block-wise scales of ``scaled_gemm`` (DeepSeek-V3's 128x128 weights, 1x128 activations).
SCALE_BLOCK = 128
#: The largest magnitude ``quantize_activation`` maps to, per quantized dtype. e4m3fnuz uses 224, not
#: its 240 maximum, as vLLM and SGLang do (scales then match an e4m3fn checkpoint's halved).
QMAX = {torch.float8_e4m3fn: 448.0, torch.float8_e4m3fnuz: 224.0, torch.int8: 127.0}
#: ``quantize_activation``'s scale formats: any float32, or a power of two (ue8m0, DeepSeek-V3.1+).
SCALE_FORMATS = ("float", "ue8m0")
#: The floor of a group's absolute maximum (or range) before it is scaled.
AMAX_FLOOR = 1e-10


@spec_op(returns=("out",))
def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    b_scale: torch.Tensor | None = None,
    b_zero_point: torch.Tensor | None = None,
    group_size: int | None = None,
) -> torch.Tensor:
    """``a @ b.T + bias``.

    a [M, K], b [N, K] of one floating dtype; bias [N] or None. Returns [M, N] in
    ``out_dtype`` (default: a's dtype). M may be 0.

    Packed int4 weights (spec 1.9): b uint8 [N, ceil(K/2)] with ``b_scale`` float32
    [N, ceil(K/group_size)], ``group_size`` and optional ``b_zero_point`` uint8 of b_scale's
    shape (the module docstring's encoding); a is float16, bfloat16 or float32 (float64 for the
    oracle) and ``out = a @ w.T + bias`` with the dequantized w, accumulated in float32 or wider;
    bias [N] of a's dtype or float32 is added in float32 before the one rounding to out_dtype. A
    float b takes none of the three; a uint8 b needs b_scale and group_size.
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
    b_scale: torch.Tensor | None = None,
    b_zero_point: torch.Tensor | None = None,
    group_size: int | None = None,
) -> torch.Tensor:
    """One GEMM per group of consecutive rows: rows of group g use weight b[g].

    a [M, K], b [G, N, K] of one floating dtype; group_ends int32 [G],
    non-decreasing, each in [0, M]: group g owns rows
    ``[group_ends[g-1], group_ends[g])`` (group -1 ends at 0). An empty group is
    legal; rows past ``group_ends[-1]`` are zero in the output. Returns [M, N] in
    ``out_dtype`` (default: a's dtype).

    Packed int4 weights (spec 1.9, the experts of W4A16 checkpoints under expert
    parallelism): b uint8 [G, N, ceil(K/2)], ``b_scale`` float32 [G, N, ceil(K/group_size)],
    optional ``b_zero_point`` uint8 of b_scale's shape, each b[g] dequantized as ``gemm``'s.
    """


@spec_op(returns=(Output("q", "exact"), Output("scale", "exact"), Output("zero_point", "exact", when="asymmetric")))
def quantize_activation(
    x: torch.Tensor,
    *,
    dtype: torch.dtype,
    group_size: int | None = 128,
    scale_fmt: str = "float",
    asymmetric: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Dynamic quantization of activations, per token or per token-group, bit-exact on every backend.

    x [M, K] (K >= 1; float16, bfloat16, float32; float64 for the oracle), first rounded to float32;
    ``dtype`` float8_e4m3fn, float8_e4m3fnuz or int8; ``group_size`` a positive int (each row
    cut into ceil(K / group_size) groups, the last one partial when it does not divide K;
    DeepSeek and Qwen3-FP8 use 128) or None (one group per row). With ``qmax = QMAX[dtype]``,
    per group g of row m, in float32::

        amax = max(max |x_g|, 1e-10)
        s    = amax / qmax                      # correctly rounded division
        s    = 2 ** ceil(log2(s))               # only with scale_fmt "ue8m0": the smallest power of two >= s
        q_g  = clamp(x_g / s, -qmax, qmax)      # a division, not a product with 1/s
               rounded to nearest, ties to even, into dtype (int8: then clamped to [-128, 127])

    ``asymmetric`` (int8 with scale_fmt "float" only; compressed-tensors' asymmetric dynamic
    activations). The range always contains 0 (torch.ao's convention), so 0 is exact and the zero
    point stays in [-128, 127] even for a group of one sign or a constant group::

        lo, hi = min(min(x_g), 0), max(max(x_g), 0)
        s  = max(hi - lo, 1e-10) / 255
        zp = clamp(round_half_even(-128 - lo / s), -128, 127)          # int32
        q_g = clamp(round_half_even(x_g / s) + zp, -128, 127)

    so that ``dequant = (q - zp) * s``. Returns (q [M, K] in dtype, scale float32 [M, G]) and with
    ``asymmetric`` also zero_point int32 [M, G]; G = ceil(K / group_size), or 1 when group_size is
    None. M = 0 is legal. Every output is compared bit for bit.
    """


@spec_op(returns=("out",))
def scaled_grouped_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    group_ends: torch.Tensor,
    *,
    a_zero_point: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """One quantized GEMM per group of consecutive rows (the MoE experts of fp8 and W8A8 checkpoints).

    a [M, K] and b [G, N, K] of one quantized dtype (float8_e4m3fn, float8_e4m3fnuz or int8);
    group_ends as in ``grouped_gemm`` (rows of group g use b[g]; rows past ``group_ends[-1]``
    are zero). Scales are float32; each one's shape says its form:

    - a_scale: [M, ceil(K/128)] (1x128 groups, ``quantize_activation(group_size=128)``),
      [M, 1] (per token) or one element (per tensor);
    - b_scale: [G, ceil(N/128), ceil(K/128)] (128x128 blocks), [G, N, 1] (per output channel)
      or [G] (one per group).

    ``dequant(a)[m, k] = (a[m, k] - zp[m]) * a_scale[...]`` at the entry covering (m, k), with
    ``a_zero_point`` int32 [M, 1] (int8 with a per-token a_scale only; None: zp = 0), and
    ``dequant(b[g])`` likewise without a zero point. ``out = dequant(a) @ dequant(b[g]).T`` per
    row, accumulated in float32 or wider (exactly, in int32, for int8 products within a 128-column
    block), and returned as [M, N] in out_dtype (bfloat16, float16 or float32).
    """
