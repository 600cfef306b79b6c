"""Planted bugs of the packed int4 weights (spec 1.9, W4A16), each the one mistake of a W4A16 kernel:

- gemm reads the nibbles in the wrong order (the high nibble for the even column, as a kernel that
  unpacks AWQ's or a big-endian layout would);
- gemm counts a row's scale groups as floor(K / g): the partial last group reads its neighbour's scale;
- grouped_gemm finds a column's group from its packed byte (j // g, not 2j // g): every group but the
  first reads a scale of half its index;
- fused_moe takes a missing zero point as 0 instead of the symmetric 8 (every code off by 8).

The gemm and grouped_gemm bugs are the reference run on the weight or scales the bug effectively reads
(for a float weight the reference itself). The fused_moe bug is one of ``broken_moe``'s independent
mini fused_moe (listed in its BUGS), which dequantizes packed experts here (``mini_dequant_int4``).
``broken_backends.BUGS`` includes ``BUGS``.
"""

from __future__ import annotations

import torch

from hetero_cpu_ref import gemm as ref_gemm

__all__ = ["BUGS", "mini_dequant_int4"]


def mini_dequant_int4(
    w: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None, group_size: int, k: int, bug: str | None
) -> torch.Tensor:
    """float32 [N, K] of a packed uint8 [N, ceil(K/2)]: each byte shifted right by 0 and 4, masked, each
    column's scale and zero point gathered from its group k // g. ``bug``: int4_symmetric_zero_point_as_0."""
    shifts = torch.tensor([0, 4], dtype=torch.uint8, device=w.device)
    q = ((w.unsqueeze(-1) >> shifts) & 15).reshape(w.shape[0], -1)[:, :k].to(torch.float32)
    group = torch.arange(k, device=w.device) // group_size
    default = 0.0 if bug == "int4_symmetric_zero_point_as_0" else 8.0
    zp = default if zero_point is None else zero_point[:, group].to(torch.float32)
    return (q - zp) * scale[:, group].to(torch.float32)


def _packed(b: object) -> bool:
    return isinstance(b, torch.Tensor) and b.dtype == torch.uint8


def _gemm_nibbles_swapped(a, b, *, bias=None, out_dtype=None, b_scale=None, b_zero_point=None, group_size=None):
    if _packed(b):
        b = (b << 4) | (b >> 4)  # the high nibble read as the even column
    return ref_gemm.gemm(
        a, b, bias=bias, out_dtype=out_dtype, b_scale=b_scale, b_zero_point=b_zero_point, group_size=group_size
    )


def _floor_groups(t: torch.Tensor | None, k: int, g: int) -> torch.Tensor | None:
    """A per-group tensor whose partial last group holds its neighbour's values (groups counted floor(K/g))."""
    if t is None or k % g == 0 or t.shape[-1] < 2:
        return t
    t = t.clone()
    t[..., -1] = t[..., -2]
    return t


def _gemm_partial_group(a, b, *, bias=None, out_dtype=None, b_scale=None, b_zero_point=None, group_size=None):
    if _packed(b) and isinstance(group_size, int) and isinstance(a, torch.Tensor):
        k = a.shape[1]
        b_scale, b_zero_point = _floor_groups(b_scale, k, group_size), _floor_groups(b_zero_point, k, group_size)
    return ref_gemm.gemm(
        a, b, bias=bias, out_dtype=out_dtype, b_scale=b_scale, b_zero_point=b_zero_point, group_size=group_size
    )


def _half_index(t: torch.Tensor | None) -> torch.Tensor | None:
    """A per-group tensor as read with group j // 2 in place of j (the group of packed byte k // 2)."""
    if t is None:
        return None
    return t[..., torch.arange(t.shape[-1], device=t.device) // 2]


def _grouped_packed_column(a, b, group_ends, *, out_dtype=None, b_scale=None, b_zero_point=None, group_size=None):
    if _packed(b) and isinstance(b_scale, torch.Tensor):
        b_scale, b_zero_point = _half_index(b_scale), _half_index(b_zero_point)
    opts = dict(b_scale=b_scale, b_zero_point=b_zero_point, group_size=group_size)
    return ref_gemm.grouped_gemm(a, b, group_ends, out_dtype=out_dtype, **opts)


#: bug name -> (the op it breaks, its implementation)
BUGS = {
    "int4_nibble_order_swapped": ("gemm", staticmethod(_gemm_nibbles_swapped)),
    "int4_partial_group_reads_previous_scale": ("gemm", staticmethod(_gemm_partial_group)),
    "int4_group_from_packed_column": ("grouped_gemm", staticmethod(_grouped_packed_column)),
}
