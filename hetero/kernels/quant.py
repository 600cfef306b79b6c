"""Triton quantized ops: quantize_activation (bit-exact) and scaled_grouped_gemm (one launch over
every group), plus the launcher fused_moe's quantized mode shares.

Semantics: ``hetero.spec.gemm``. Kernels: ``hetero.kernels._quant_kernels`` (the quantizer) and
``hetero.kernels._scaled_grouped_kernels`` (the GEMM). Only cheap checks run here; nothing reads
a tensor's values on the host, so no op synchronizes with the device.
"""

from __future__ import annotations

import torch

from hetero.kernels import _quant_kernels as qk
from hetero.kernels import _scaled_grouped_kernels as sk
from hetero.kernels._triton import triton_modules
from hetero.kernels.gemm import grouped_work_tiles, interpreted, tiles
from hetero.kernels.tuning import Tuning
from hetero.spec._checks_quant import check_quantize_inputs, check_scaled_grouped
from hetero.spec.gemm import QMAX, SCALE_BLOCK

triton, tl = triton_modules()

__all__ = ["quantize_activation", "scaled_grouped_gemm", "quantize", "launch_scaled_grouped"]

_MODES = {torch.float8_e4m3fn: qk.FN, torch.float8_e4m3fnuz: qk.FNUZ, torch.int8: qk.INT8}
_FORMS = {"tensor": sk.TENSOR, "group": sk.TENSOR, "row": sk.ROW, "block": sk.BLOCK, "none": sk.NONE}


def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def quantize(
    x: torch.Tensor, dtype: torch.dtype, group_size: int | None, ue8m0: bool, asymmetric: bool, tuning: Tuning
):
    """(q, scale[, zero_point]) of x [M, K] (the checked arguments of quantize_activation)."""
    m, k = x.shape
    width = k if group_size is None else int(group_size)
    groups = 1 if group_size is None else -(-k // width)
    q = torch.empty(m, k, dtype=dtype, device=x.device)
    scale = torch.empty(m, groups, dtype=torch.float32, device=x.device)
    zp = torch.empty(m, groups, dtype=torch.int32, device=x.device) if asymmetric else None
    if m == 0 or groups == 0:
        return (q, scale, zp) if asymmetric else (q, scale)
    meta, launch = Tuning.launch_options(tuning("quantize_activation"))
    block_k = min(int(meta.get("BLOCK_K", 128)), _pow2(width))
    block_m = max(1, min(int(meta.get("BLOCK_M", 4)), _pow2(m)))
    qv = q if dtype == torch.int8 else q.view(torch.uint8)
    zpt = zp if asymmetric else scale
    qk.quantize_kernel[(triton.cdiv(m, block_m), groups)](
        x, qv, scale, zpt, m, k, width,
        x.stride(0), x.stride(1), qv.stride(0), qv.stride(1),
        scale.stride(0), scale.stride(1), zpt.stride(0), zpt.stride(1),
        QMAX=float(QMAX[dtype]), MODE=_MODES[dtype], ASYM=asymmetric, UE8M0=ue8m0, BLOCK_M=block_m, BLOCK_K=block_k,
        **launch)  # fmt: skip
    return (q, scale, zp) if asymmetric else (q, scale)


def quantize_activation(x, *, dtype, group_size=128, scale_fmt="float", asymmetric=False, tuning: Tuning):
    check_quantize_inputs("quantize_activation", x, dtype, group_size, scale_fmt, asymmetric)
    return quantize(x, dtype, group_size, scale_fmt == "ue8m0", asymmetric, tuning)


def launch_scaled_grouped(
    a,
    b,
    a_scale,
    b_scale,
    group_ends,
    c,
    *,
    forms: tuple[str, str],
    tuning: Tuning,
    zp=None,
    perm=None,
    topk: int = 1,
    swiglu: bool = False,
    act=(0, 0.0, 0.0),
    bias=None,
) -> torch.Tensor:
    """c[rows] = the scaled grouped product (see scaled_grouped_kernel); ``forms`` = (a form, b form),
    a form "none" for a float ``a`` (weight-only; a_scale unused)."""
    m, n = c.shape
    groups, k = b.shape[0], b.shape[2]
    if m == 0 or n == 0:
        return c
    meta, launch = tiles(tuning, "scaled_grouped_gemm", m, n, k, least_k=32)
    meta["BLOCK_K"] = min(meta["BLOCK_K"], SCALE_BLOCK)  # one K step inside one 128-block of scales
    a_form, b_form = forms
    sa = c if a_form == "none" else (a_scale.reshape(1, 1) if a_form == "tensor" else a_scale)  # c: an unread stand-in
    sb = b_scale.reshape(groups, 1, 1) if b_form == "group" else b_scale
    zpt = zp if zp is not None else sa
    bias_at = bias if bias is not None else group_ends
    code, alpha, limit = act
    grid = (grouped_work_tiles(m, groups, meta["BLOCK_M"]), triton.cdiv(n, meta["BLOCK_N"]))
    sk.scaled_grouped_kernel[grid](
        a, b, sa, sb, zpt, c, group_ends, perm if perm is not None else group_ends, bias_at,
        m, n, k, groups, topk, a.shape[0], float(alpha), float(limit),
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), b.stride(2), sa.stride(0), sa.stride(1),
        sb.stride(0), sb.stride(1), sb.stride(2), zpt.stride(0), c.stride(0), c.stride(1), group_ends.stride(0),
        bias_at.stride(0), bias_at.stride(-1),
        A_FORM=_FORMS[a_form], B_FORM=_FORMS[b_form], IS_INT=a.dtype == torch.int8, HAS_ZP=zp is not None,
        UPCAST=interpreted(tuning) and a.dtype != torch.int8, GATHER=perm is not None, SWIGLU=swiglu, ACT=int(code),
        HAS_BIAS=bias is not None, SOFT_RTNE=interpreted(tuning) and c.dtype == torch.bfloat16, G_POW2=_pow2(groups),
        BLOCK_M=meta["BLOCK_M"], BLOCK_N=meta["BLOCK_N"], BLOCK_K=meta["BLOCK_K"], **launch,
    )  # fmt: skip
    return c


def scaled_grouped_gemm(
    a, b, a_scale, b_scale, group_ends, *, a_zero_point=None, out_dtype=torch.bfloat16, tuning: Tuning
) -> torch.Tensor:
    a_form, b_form = check_scaled_grouped(
        "scaled_grouped_gemm", a, b, a_scale, b_scale, group_ends, a_zero_point, out_dtype
    )
    c = torch.empty(a.shape[0], b.shape[1], dtype=out_dtype, device=a.device)
    return launch_scaled_grouped(
        a, b, a_scale, b_scale, group_ends, c, forms=(a_form, b_form), zp=a_zero_point, tuning=tuning
    )
