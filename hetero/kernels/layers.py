"""Triton kernels of the glue ops: rms_norm (optionally fused with the residual add, with a
weight offset, or gated), layer_norm (weight and optional bias), rotary_embedding (NeoX and
interleaved pairs, partial rotary) and silu_and_mul.

Semantics: ``hetero.spec.layers``. Each kernel computes in float32 (float64 when an input is
float64) and rounds once to the input's dtype; inputs are read through their strides and
never modified; outputs are new contiguous tensors.

Launch shapes (what a GPU runs):

* rms_norm: one program per tile of rows (one row when the hidden size is large, several
  for small rows such as the per-head q/k norm); the sum of squares is a float32 reduction
  along the row. Rows up to ``MAX_ROW_BLOCK`` elements stay in registers (one pass);
  longer rows are streamed twice (sum of squares, then normalize).
* layer_norm: rms_norm's row tiles; mean, variance and output in three streamed passes.
* rotary_embedding: one program per token; it loads the token's cos/sin row once and
  loops over tiles of query heads, then key heads; dims past ``rot`` are copied through.
  A position outside [0, max_pos) is masked: it reads nothing and rotates by angle 0.
* silu_and_mul: a 2-D grid of (row tile, column tile) over [rows, I].

Tiles come from the tuning table: "rows" (num_warps, optional ``BLOCK`` elements per
program) for rms_norm and layer_norm, "elementwise" (``BLOCK``) for the other two.

The kernels are in ``hetero.kernels._layer_kernels``; bf16 outputs are rounded through
``cast_out`` (``hetero.kernels._rounding``, re-exported here), which rounds to nearest
even under the interpreter as a GPU does.
"""

from __future__ import annotations

import torch

from hetero.kernels import _layer_kernels as kern
from hetero.kernels._rounding import cast_out, rne_bf16
from hetero.kernels._triton import triton_modules
from hetero.kernels.tuning import Tuning
from hetero.spec._checks_dsa import check_layer_norm
from hetero.spec.checks import check_at_least_1d, check_rms_norm, check_rotary, expect
from hetero.spec.layers import check_rms_norm_options
from hetero.spec.types import FLOAT_DTYPES

triton, tl = triton_modules()

__all__ = ["rms_norm", "layer_norm", "rotary_embedding", "silu_and_mul", "cast_out", "rne_bf16"]

#: rms_norm keeps a whole row in registers up to this many elements (hidden 16384 fits).
MAX_ROW_BLOCK = 16384
#: rms_norm packs rows into one program up to this many elements, unless "rows" sets BLOCK.
ROW_TILE = 4096
ROW_TILE_INTERPRETED = 16384  # the interpreter pays per program: fewer, bigger tiles


def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def _acc(*tensors: torch.Tensor | None):
    return tl.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else tl.float32


def _rows2d(x: torch.Tensor) -> torch.Tensor:
    """x [..., H] as [R, H]: a view whenever the leading dims collapse (any inner stride is
    kept: the kernels read it), else a copy."""
    return x.reshape(-1, x.shape[-1]) if x.ndim != 2 else x


# ----------------------------------------------------------------------------- launchers


def _row_tiles(rows: int, hidden: int, tuning: Tuning) -> tuple[int, int, dict]:
    """rms_norm's (BLOCK_R, BLOCK_H, launch options) for ``rows`` rows of ``hidden`` elements."""
    meta, launch = Tuning.launch_options(tuning("rows"))
    tile = int(meta.get("BLOCK", ROW_TILE_INTERPRETED if tuning.interpreted else ROW_TILE))
    bh = min(_pow2(hidden), MAX_ROW_BLOCK)
    br = max(1, min(_pow2(rows), tile // bh))
    if not tuning.interpreted and "num_warps" in launch:
        # at least one warp per 1024 elements of the tile, so a long row does not spill
        launch["num_warps"] = min(16, max(int(launch["num_warps"]), (br * bh) // 1024))
    return br, bh, launch


def rms_norm(x, weight, eps, *, residual=None, weight_offset=0.0, gate=None, gate_act="silu", tuning: Tuning):
    """``x / rms(x) * (weight + weight_offset)`` per row; with ``residual`` it normalizes ``h = x + residual``
    and returns ``(y, h)``; with ``gate`` the result is gated by ``silu(gate)`` or ``sigmoid(gate)``
    (``gate_act``), rounded in the spec's order. The offset reaches the kernel as a float32 scalar."""
    op = "rms_norm"
    hidden = check_rms_norm(op, x, weight, eps, residual)
    check_rms_norm_options(op, x, residual, weight_offset, gate, gate_act)

    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    h = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else None
    rows = x.numel() // hidden if hidden else 0
    if rows and hidden:
        x2 = _rows2d(x)
        r2 = _rows2d(residual) if residual is not None else x2
        g2 = _rows2d(gate) if gate is not None else x2
        y2 = y.view(-1, hidden)
        h2 = h.view(-1, hidden) if h is not None else y2
        br, bh, launch = _row_tiles(rows, hidden, tuning)
        kern.rms_norm_kernel[(triton.cdiv(rows, br),)](
            x2, r2, weight, g2, y2, h2,
            rows, hidden, float(eps), float(weight_offset),
            x2.stride(0), x2.stride(1), r2.stride(0), r2.stride(1), weight.stride(0), g2.stride(0), g2.stride(1),
            y2.stride(0), h2.stride(0),
            HAS_RES=residual is not None, HAS_GATE=gate is not None, SIGMOID_GATE=gate_act == "sigmoid",
            ACC=_acc(x, weight), ONE_PASS=bh >= hidden, RNE_BF16=rne_bf16(x.dtype, tuning),
            BLOCK_R=br, BLOCK_H=bh, **launch,
        )  # fmt: skip
    return y if residual is None else (y, h)


def layer_norm(x, weight, bias, eps, *, tuning: Tuning):
    """``(x - mean) * rsqrt(var + eps) * weight + bias`` per row (biased variance), rounded once to x's dtype."""
    op = "layer_norm"
    hidden = check_layer_norm(op, x, weight, bias, eps)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows = x.numel() // hidden if hidden else 0
    if rows == 0:
        return y
    x2 = _rows2d(x)
    br, bh, launch = _row_tiles(rows, hidden, tuning)
    b = bias if bias is not None else weight
    kern.layer_norm_kernel[(triton.cdiv(rows, br),)](
        x2, weight, b, y.view(-1, hidden), rows, hidden, float(eps),
        x2.stride(0), x2.stride(1), weight.stride(0), b.stride(0), hidden,
        HAS_BIAS=bias is not None, ACC=_acc(x, weight, bias), RNE_BF16=rne_bf16(x.dtype, tuning),
        BLOCK_R=br, BLOCK_H=bh, **launch,
    )  # fmt: skip
    return y


def rotary_embedding(positions, q, k, cos_sin_cache, *, is_neox=True, tuning: Tuning):
    """``(q, k)`` rotated by the cos/sin rows of ``positions`` (NeoX halves or interleaved pairs)."""
    tokens, head_dim, max_pos, rot = check_rotary(
        "rotary_embedding", positions, q, k, cos_sin_cache, is_neox, read_positions=False
    )  # hetero.spec.validate's, when on
    hq = q.shape[1]

    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    hk = k.shape[1]
    if tokens == 0 or (hq == 0 and hk == 0):
        return q_out, k_out
    meta, launch = Tuning.launch_options(tuning("elementwise"))
    block = int(meta.get("BLOCK", 1024))
    b_half = _pow2(rot // 2)
    b_pass = min(_pow2(head_dim - rot), block) if head_dim > rot else 1
    bh = max(1, min(_pow2(max(hq, hk)), block // max(2 * b_half, b_pass)))
    kern.rope_kernel[(tokens,)](
        positions, cos_sin_cache, q, k, q_out, k_out,
        hq, hk, head_dim, rot, max_pos,
        positions.stride(0), *cos_sin_cache.stride(),
        *q.stride(), *k.stride(),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
        IS_NEOX=is_neox, ACC=_acc(q, k, cos_sin_cache),
        RNE_Q=rne_bf16(q.dtype, tuning), RNE_K=rne_bf16(k.dtype, tuning),
        BLOCK_H=bh, BLOCK_HALF=b_half, BLOCK_PASS=b_pass, **launch,
    )  # fmt: skip
    return q_out, k_out


def silu_and_mul(x, *, tuning: Tuning) -> torch.Tensor:
    """``silu(x[..., :I]) * x[..., I:]`` for ``x`` [..., 2I]."""
    op = "silu_and_mul"
    check_at_least_1d(op, "x", x, FLOAT_DTYPES)
    width = x.shape[-1]
    expect(width % 2 == 0, op, "x", "an even last dimension (2I)", f"shape {list(x.shape)}")
    inter = width // 2
    y = torch.empty((*x.shape[:-1], inter), dtype=x.dtype, device=x.device)
    rows = x.numel() // width if width else 0
    if rows == 0 or inter == 0:
        return y
    x2 = _rows2d(x)
    meta, launch = Tuning.launch_options(tuning("elementwise"))
    block = int(meta.get("BLOCK", 1024))
    bi = min(_pow2(inter), block)
    br = max(1, min(_pow2(rows), block // bi))
    grid = (triton.cdiv(rows, br), triton.cdiv(inter, bi))
    kern.silu_and_mul_kernel[grid](
        x2, y.view(-1, inter), rows, inter,
        x2.stride(0), x2.stride(1), inter,
        ACC=_acc(x), RNE_BF16=rne_bf16(x.dtype, tuning), BLOCK_R=br, BLOCK_I=bi, **launch,
    )  # fmt: skip
    return y
