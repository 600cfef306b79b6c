"""Planted bugs of the quantized ops (spec 1.4), in a compact, independent quantize_activation (all
groups at once on a padded [M, G, group] view, ue8m0 through log2 in float64) and scaled_grouped_gemm
(both operands dequantized in full, then one float32 GEMM per group). Their bug-free forms must pass
every quick case (``make_control``), which shows each planted bug is the only difference.
``broken_backends.BUGS`` includes ``BUGS`` from here.
"""

from __future__ import annotations

import math

import torch
from _one_op import one_op_plugin

__all__ = ["BUGS", "mini_quantize_activation", "mini_scaled_grouped_gemm", "make_control"]

_QMAX = {torch.float8_e4m3fn: 448.0, torch.float8_e4m3fnuz: 224.0, torch.int8: 127.0}
_BLOCK = 128


def _grouped_view(x: torch.Tensor, width: int, fill: float) -> torch.Tensor:
    """x [M, K] as [M, G, width], the last group padded with ``fill``."""
    m, k = x.shape
    groups = -(-k // width)
    return torch.nn.functional.pad(x, (0, groups * width - k), value=fill).reshape(m, groups, width)


def _rint(y: torch.Tensor, bug: str | None) -> torch.Tensor:
    return torch.floor(y + 0.5) if bug == "int8_round_half_up" else torch.round(y)


def _to_int8(y: torch.Tensor, bug: str | None) -> torch.Tensor:
    return _rint(y, bug).clamp(-128, 127)


def mini_quantize_activation(bug: str | None):
    """quantize_activation; ``bug`` names its one mistake (None: correct)."""

    def quantize_activation(x, *, dtype, group_size=128, scale_fmt="float", asymmetric=False):
        m, k = x.shape
        width = k if group_size is None else group_size
        xf = x.float()
        g = _grouped_view(xf, width, 0.0)
        if asymmetric:
            lo = _grouped_view(xf, width, math.inf).amin(dim=2, keepdim=True).clamp(max=0)
            hi = _grouped_view(xf, width, -math.inf).amax(dim=2, keepdim=True).clamp(min=0)
            s = torch.clamp(hi - lo, min=1e-10) / 255.0
            zp = _to_int8(-128.0 - lo / s, bug)
            q = (_rint(g / s, bug) + zp).clamp(-128, 127)
            groups = g.shape[1]
            return (
                q.reshape(m, groups * width)[:, :k].to(torch.int8),
                s.reshape(m, groups),
                zp.reshape(m, groups).to(torch.int32),
            )
        qmax = 448.0 if bug == "fnuz_treated_as_fn" and dtype == torch.float8_e4m3fnuz else _QMAX[dtype]
        s = torch.clamp(g.abs().amax(dim=2, keepdim=True), min=1e-10) / qmax
        if scale_fmt == "ue8m0" and bug != "ue8m0_ignored":
            s = torch.exp2(torch.ceil(torch.log2(s.double()))).float()
        y = torch.clamp(g / s, -qmax, qmax)
        q = _to_int8(y, bug) if dtype == torch.int8 else y
        return q.reshape(m, g.shape[1] * width)[:, :k].to(dtype), s.reshape(m, g.shape[1])

    return staticmethod(quantize_activation)


def _full_scale(scale: torch.Tensor, rows: int, cols: int, bug: str | None) -> torch.Tensor:
    """A 2-D scale (one element, [rows, 1], [rows, ceil(cols/128)] or [ceil(rows/128), ceil(cols/128)])
    as [rows, cols]."""
    s = scale.float().reshape(1, 1) if scale.numel() == 1 else scale.float()
    if s.shape == (1, 1) or s.shape == (rows, 1):
        return s.expand(rows, cols)
    if (
        bug == "partial_block_scale_misread"
    ):  # blocks counted with floor(n / 128): a partial last block reads its neighbour's
        col_idx = (torch.arange(cols) // _BLOCK).clamp(max=max(cols // _BLOCK - 1, 0))
        row_idx = (
            (torch.arange(rows) // _BLOCK).clamp(max=max(rows // _BLOCK - 1, 0))
            if s.shape[0] != rows
            else torch.arange(rows)
        )
    else:
        col_idx = torch.arange(cols) // _BLOCK
        row_idx = torch.arange(rows) if s.shape[0] == rows else torch.arange(rows) // _BLOCK
    return s[row_idx][:, col_idx]


def mini_scaled_grouped_gemm(bug: str | None):
    """scaled_grouped_gemm; ``bug`` names its one mistake (None: correct)."""

    def scaled_grouped_gemm(a, b, a_scale, b_scale, group_ends, *, a_zero_point=None, out_dtype=torch.bfloat16):
        (m, k), (groups, n, _) = a.shape, b.shape
        av = a.float()
        if a_zero_point is not None and bug != "int8_zero_point_ignored":
            av = av - a_zero_point.float()
        a_deq = av * _full_scale(a_scale, m, k, bug)
        out = torch.zeros(m, n, dtype=torch.float32)
        start = 0
        for g, end in enumerate(group_ends.tolist()):
            sg = b_scale[(g - 1) % groups if bug == "group_scale_wrong_expert" else g]
            sg = sg.reshape(1, 1) if sg.ndim == 0 else sg
            b_deq = b[g].float() * _full_scale(sg, n, k, bug)
            out[start:end] = a_deq[start:end] @ b_deq.T
            start = end
        return out.to(out_dtype)

    return staticmethod(scaled_grouped_gemm)


_MINIS = {"quantize_activation": mini_quantize_activation, "scaled_grouped_gemm": mini_scaled_grouped_gemm}

#: bug name -> (the op it breaks, its implementation)
BUGS = {
    "ue8m0_ignored": ("quantize_activation", mini_quantize_activation("ue8m0_ignored")),
    "fnuz_treated_as_fn": ("quantize_activation", mini_quantize_activation("fnuz_treated_as_fn")),
    "int8_round_half_up": ("quantize_activation", mini_quantize_activation("int8_round_half_up")),
    "partial_block_scale_misread": ("scaled_grouped_gemm", mini_scaled_grouped_gemm("partial_block_scale_misread")),
    "group_scale_wrong_expert": ("scaled_grouped_gemm", mini_scaled_grouped_gemm("group_scale_wrong_expert")),
    "int8_zero_point_ignored": ("scaled_grouped_gemm", mini_scaled_grouped_gemm("int8_zero_point_ignored")),
}


def make_control(op: str):
    """A plugin whose ``op`` is the bug-free mini implementation (same shape as ``make_plugin``'s result)."""
    return one_op_plugin(f"control_{op}", op, _MINIS[op](None))
