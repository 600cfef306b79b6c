"""fused_moe's quantized experts (private: the op lives in ``hetero.kernels.moe``).

W8A8 (``act_quant`` "group128" or "token"): x quantized per token (group) once with the
quantizer kernel (quantizing before the gather is the same as after it: the groups lie inside a
row), the first scaled grouped GEMM reads its rows through perm and applies bias, rounding and
activation in its epilogue (h in x's dtype); h quantized; the second scaled grouped GEMM adds
w2's bias. Weight-only (``act_quant`` None, W8A16): the same two GEMMs with a float ``a`` and
each weight tile dequantized in the kernel. Each GEMM's bias enters in float32 before the one
rounding to x's dtype, as the reference composition does.
"""

from __future__ import annotations

import torch

from hetero.kernels.quant import launch_scaled_grouped, quantize
from hetero.kernels.tuning import Tuning

__all__ = ["quant_experts"]


def _input(a: torch.Tensor, dtype: torch.dtype, act_quant: str | None, ue8m0: bool, tuning: Tuning):
    """(GEMM input, its scale, its form): a quantized as ``act_quant`` says, or a itself (weight-only)."""
    if act_quant is None:
        return a, a, "none"
    group = 128 if act_quant == "group128" else None
    q, scale = quantize(a, dtype, group, ue8m0, False, tuning)
    return q, scale, "block" if group is not None else "row"


def quant_experts(
    x,
    w13,
    w2,
    w13_scale,
    w2_scale,
    forms: tuple[str, str],
    ends,
    perm,
    topk: int,
    act,
    w13_bias,
    w2_bias,
    act_quant: str | None,
    act_scale_fmt: str,
    tuning: Tuning,
) -> torch.Tensor:
    """y_sorted [P, H] in x's dtype: both expert GEMMs over the P pairs sorted by expert."""
    pairs, inter = perm.numel(), w13.shape[1] // 2
    ue8m0 = act_scale_fmt == "ue8m0"
    a, a_scale, a_form = _input(x, w13.dtype, act_quant, ue8m0, tuning)
    h = x.new_empty(pairs, inter)
    launch_scaled_grouped(
        a,
        w13,
        a_scale,
        w13_scale,
        ends,
        h,
        forms=(a_form, forms[0]),
        tuning=tuning,
        perm=perm,
        topk=topk,
        swiglu=True,
        act=act,
        bias=w13_bias,
    )
    a, a_scale, a_form = _input(h, w2.dtype, act_quant, ue8m0, tuning)
    y_sorted = x.new_empty(pairs, x.shape[1])
    return launch_scaled_grouped(
        a, w2, a_scale, w2_scale, ends, y_sorted, forms=(a_form, forms[1]), tuning=tuning, bias=w2_bias
    )
