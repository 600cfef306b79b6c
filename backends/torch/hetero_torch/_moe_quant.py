"""fused_moe's quantized expert GEMMs (spec 1.4): W8A8 through the quantizer and the scaled grouped
product, or weight-only (W8A16) on the dequantized weights."""

from __future__ import annotations

import torch

from hetero_torch._gemm_grouped import grouped_matmul, used_groups
from hetero_torch._gemm_quant import dequant_b, quantize, scaled_grouped_product

__all__ = ["quant_expert_linear"]


def quant_expert_linear(
    a: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor,
    form: str,
    bias: torch.Tensor | None,
    expert: torch.Tensor,
    group_ends: torch.Tensor,
    ends: list[int],
    act_quant: str | None,
    act_scale_fmt: str,
) -> torch.Tensor:
    """Row r of ``dequant(a) @ dequant(w[expert[r]]).T + bias[expert[r]]`` rounded once to a's dtype; a
    quantized per act_quant ("group128", "token") or kept (None: weight-only). Rows sorted by expert."""
    if act_quant is None:
        acc = torch.float64 if torch.float64 in (a.dtype, scale.dtype) else torch.float32
        w, scale, kept_ends, kept = used_groups(w, scale, ends)
        y = grouped_matmul(a.to(acc), dequant_b(w, scale, form, acc), kept_ends, kept, acc)
    else:
        group = 128 if act_quant == "group128" else None
        q, a_scale = quantize(a, w.dtype, group, act_scale_fmt == "ue8m0", False)
        if a.dtype == torch.float64:  # the oracle: as wide as its float64 scales
            a_scale = a_scale.double()
        a_form = "block" if group is not None else "row"
        y = scaled_grouped_product(q, w, a_scale, scale, group_ends, ends, (a_form, form), None)
    if bias is not None:
        y = y + bias.to(y.dtype).index_select(0, expert)
    return y.to(a.dtype)
