"""fused_moe's quantized expert GEMMs (spec 1.4): W8A8 through quantize_activation and
scaled_grouped_gemm, or weight-only (W8A16) on the dequantized weights."""

from __future__ import annotations

import torch

from hetero.spec.checks import scale_blocks
from hetero.spec.gemm import SCALE_BLOCK
from hetero_cpu_ref.quant import expand_b_scale, quantize_activation, scaled_grouped_product

__all__ = ["quant_expert_linear", "dequant_weight"]


def dequant_weight(w: torch.Tensor, scale: torch.Tensor, form: str, acc: torch.dtype) -> torch.Tensor:
    """One expert's ``w * scale`` [N, K] in ``acc``; scale is that expert's row of a grouped b_scale."""
    n, k = w.shape
    s = expand_b_scale(scale, form, n, scale_blocks(k) if form == "block" else 1, acc)
    full = s.repeat_interleave(SCALE_BLOCK, dim=1)[:, :k] if form == "block" else s
    return w.to(acc) * full


def _row_bias(bias: torch.Tensor, ends: list[int], acc: torch.dtype) -> torch.Tensor:
    """bias [E, N] as one row per grouped row (rows of group g get bias[g])."""
    counts = torch.tensor([e - s for s, e in zip([0] + ends[:-1], ends)], device=bias.device)
    return bias.to(acc).repeat_interleave(counts, dim=0)


def _weight_only(a: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, form: str, ends: list[int]) -> torch.Tensor:
    acc = torch.float64 if torch.float64 in (a.dtype, scale.dtype) else torch.float32
    out = torch.zeros(a.shape[0], w.shape[1], dtype=acc, device=a.device)
    start = 0
    for g, end in enumerate(ends):
        if end > start:
            out[start:end] = a[start:end].to(acc) @ dequant_weight(w[g], scale[g], form, acc).T
        start = end
    return out


def quant_expert_linear(
    a: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor,
    form: str,
    bias: torch.Tensor | None,
    group_ends: torch.Tensor,
    act_quant: str | None,
    act_scale_fmt: str,
) -> torch.Tensor:
    """Rows [ends[g-1], ends[g]) of ``dequant(a) @ dequant(w[g]).T + bias[g]`` rounded once to a's dtype:
    a quantized with quantize_activation (act_quant "group128" or "token"), or kept (act_quant None)."""
    ends = group_ends.tolist()
    if act_quant is None:
        y = _weight_only(a, w, scale, form, ends)
    else:
        group = 128 if act_quant == "group128" else None
        q, a_scale = quantize_activation(a, dtype=w.dtype, group_size=group, scale_fmt=act_scale_fmt)
        a_form = "block" if group is not None else "row"
        if a.dtype == torch.float64:  # the oracle: accumulate as wide as its float64 scales
            a_scale = a_scale.double()
        y = scaled_grouped_product(q, w, a_scale, scale, ends, a_form, form, None)
    if bias is not None:
        y = y + _row_bias(bias, ends, y.dtype)
    return y.to(a.dtype)
