"""Triton GEMMs: gemm, scaled_gemm (fp8 e4m3fn / e4m3fnuz and int8, scales per tensor, per
token / channel or in 128-blocks) and grouped_gemm (one launch over every group). Packed int4
weights (spec 1.9) go to ``hetero.kernels.int4``.

Semantics: ``hetero.spec.gemm``. The kernels and their launch design are in
``hetero.kernels._gemm_kernels``. Inputs are addressed through their strides (a strided
``a`` is never copied). Only cheap checks run here (ranks, dtypes, shapes, devices): nothing
reads a tensor's values on the host, so no op synchronizes with the device.
"""

from __future__ import annotations

import torch

from hetero.kernels import _gemm_kernels as kern
from hetero.kernels import int4
from hetero.kernels._triton import interpreter_requested, triton_modules
from hetero.kernels.tuning import Tuning
from hetero.spec.checks import check_scale_form, check_tensor, expect, scale_blocks
from hetero.spec.gemm import SCALE_BLOCK
from hetero.spec.types import FLOAT_DTYPES

triton, tl = triton_modules()

__all__ = ["gemm", "scaled_gemm", "grouped_gemm", "QUANT_DTYPES", "SCALED_OUT_DTYPES"]

QUANT_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.int8)
SCALED_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_FORMS = {"tensor": kern.TENSOR, "row": kern.ROW, "block": kern.BLOCK}


# ----------------------------------------------------------------------------- checks


def _dt(d: object) -> str:
    return str(d).replace("torch.", "")


def check_operands(op: str, a: object, b: object, dtypes: tuple, b_ndim: int = 2) -> None:
    """a [M, K] and b [..., N, K] of one dtype from ``dtypes``, on one device."""
    check_tensor(op, "a", a, ndim=2, dtypes=dtypes)
    check_tensor(op, "b", b, ndim=b_ndim, dtypes=dtypes)
    expect(b.dtype == a.dtype, op, "b", f"dtype {_dt(a.dtype)} (that of 'a')", _dt(b.dtype))
    expect(b.device == a.device, op, "b", f"device {a.device} (that of 'a')", b.device)
    layout = "[N, K]" if b_ndim == 2 else "[G, N, K]"
    expect(
        b.shape[-1] == a.shape[1],
        op,
        "b",
        f"shape {layout} with K = {a.shape[1]} (a's columns; nn.Linear layout)",
        f"shape {list(b.shape)}",
    )


def _check_out_dtype(op: str, out_dtype: object, allowed: tuple) -> None:
    expect(out_dtype in allowed, op, "out_dtype", "one of " + ", ".join(_dt(d) for d in allowed), _dt(out_dtype))


def _check_bias(op: str, bias: object, n: int, dtypes: tuple, device: torch.device) -> None:
    if bias is None:
        return
    check_tensor(op, "bias", bias, shape=(n,), dtypes=dtypes)
    expect(bias.device == device, op, "bias", f"device {device} (that of 'a')", bias.device)


# ----------------------------------------------------------------------------- launch helpers


def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def _fit(block: int, size: int, least: int = 16) -> int:
    """A tile edge no larger than the (power-of-two rounded) size it covers, at least ``least``."""
    return max(least, min(int(block), _pow2(size)))


def interpreted(tuning: Tuning) -> bool:
    """Whether the kernels run in Triton's interpreter (then its workarounds are switched on)."""
    return tuning.interpreted or interpreter_requested()


def float_flags(dtype: torch.dtype, tuning: Tuning) -> dict:
    """Constexprs of a floating dot: accumulator dtype, interpreter workarounds (bf16 dot operands
    upcast to float32, bf16 outputs rounded by hand), IEEE (not TF32) float32 products."""
    upcast = interpreted(tuning) and dtype == torch.bfloat16
    return {
        "ACC": tl.float64 if dtype == torch.float64 else tl.float32,
        "UPCAST": upcast,
        "IEEE": upcast or dtype in (torch.float32, torch.float64),
        "SOFT_RTNE": interpreted(tuning),
    }


_MAX_BLOCK = 1 << 20


def tiles(tuning: Tuning, kernel: str, m: int, n: int, k: int, least_k: int = 16) -> tuple[dict, dict]:
    """(tile constexprs fitted to the problem, launch options) of a tuning entry."""
    meta, launch = Tuning.launch_options(tuning(kernel))
    out = {  # tl.dot needs 16-row tiles on hardware; the interpreter runs any size (small MoE groups)
        "BLOCK_M": _fit(meta.get("BLOCK_M", 64), m, 1 if tuning.interpreted else 16),
        "BLOCK_N": _fit(meta.get("BLOCK_N", 64), n),
        "BLOCK_K": _fit(meta.get("BLOCK_K", 32), k, least_k),
    }
    if "GROUP_M" in meta:
        out["GROUP_M"] = int(meta["GROUP_M"])
    while out["BLOCK_K"] * out["BLOCK_N"] > _MAX_BLOCK and out["BLOCK_K"] > least_k:
        out["BLOCK_K"] //= 2  # Triton refuses a block of more than 2**20 elements (the b tile is BLOCK_K x BLOCK_N)
    return out, launch


def grouped_work_tiles(m: int, groups: int, block_m: int) -> int:
    """Upper bound of the work tiles of a grouped GEMM over m rows in ``groups`` groups plus the tail:
    sum over the (at most min(G + 1, m)) non-empty parts of cdiv(rows, BLOCK_M)."""
    return triton.cdiv(m, block_m) + min(groups + 1, m)


def launch_grouped(
    a,
    b,
    group_ends,
    c,
    *,
    tuning: Tuning,
    kernel: str = "grouped_gemm",
    perm=None,
    topk: int = 1,
    swiglu: bool = False,
    act: tuple[int, float, float] = (0, 0.0, 0.0),
    bias=None,
) -> torch.Tensor:
    """c[rows] = grouped product (see _grouped_gemm_kernel); c's row count is the row count M.
    ``act`` = (ACT, ALPHA, LIMIT) of the SWIGLU epilogue; ``bias`` [G, N] ([G, 2N] with swiglu) or None."""
    m, n = c.shape
    groups, k = b.shape[0], b.shape[2]
    if m == 0 or n == 0:
        return c
    meta, launch = tiles(tuning, kernel, m, n, k)
    grid = (grouped_work_tiles(m, groups, meta["BLOCK_M"]), triton.cdiv(n, meta["BLOCK_N"]))
    code, alpha, limit = act
    bias_at = bias if bias is not None else group_ends
    kern._grouped_gemm_kernel[grid](
        a, b, c, group_ends, perm if perm is not None else group_ends, bias_at,
        m, n, k, groups, topk, n * b.stride(1), a.shape[0], float(alpha), float(limit),
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), b.stride(2), c.stride(0), c.stride(1), group_ends.stride(0),
        bias_at.stride(0), bias_at.stride(-1),
        GATHER=perm is not None, SWIGLU=swiglu, ACT=int(code), HAS_BIAS=bias is not None, G_POW2=_pow2(groups),
        **float_flags(a.dtype, tuning), BLOCK_M=meta["BLOCK_M"], BLOCK_N=meta["BLOCK_N"], BLOCK_K=meta["BLOCK_K"],
        **launch,
    )  # fmt: skip
    return c


# ----------------------------------------------------------------------------- ops


def gemm(a, b, *, bias=None, out_dtype=None, b_scale=None, b_zero_point=None, group_size=None, tuning: Tuning):
    g = int4.check_int4_gemm(a, b, bias, out_dtype, (b_scale, b_zero_point, group_size))
    if g is not None:  # spec 1.9: packed int4 b (W4A16)
        return int4.gemm(a, b, b_scale, b_zero_point, g, bias=bias, out_dtype=out_dtype, tuning=tuning)
    op = "gemm"
    check_operands(op, a, b, FLOAT_DTYPES)
    out_dtype = a.dtype if out_dtype is None else out_dtype
    _check_out_dtype(op, out_dtype, FLOAT_DTYPES)
    _check_bias(op, bias, b.shape[0], FLOAT_DTYPES, a.device)
    (m, k), n = a.shape, b.shape[0]
    c = torch.empty(m, n, dtype=out_dtype, device=a.device)
    if m == 0 or n == 0:
        return c
    meta, launch = tiles(tuning, "gemm", m, n, k)
    meta.setdefault("GROUP_M", 8)
    grid = (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)
    kern._gemm_kernel[grid](
        a, b, bias if bias is not None else c, c, m, n, k,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        HAS_BIAS=bias is not None, **float_flags(a.dtype, tuning), **meta, **launch,
    )  # fmt: skip
    return c


def scaled_gemm(a, b, a_scale, b_scale, *, bias=None, out_dtype=torch.bfloat16, tuning: Tuning) -> torch.Tensor:
    op = "scaled_gemm"
    check_operands(op, a, b, QUANT_DTYPES)
    (m, k), n = a.shape, b.shape[0]
    a_form = check_scale_form(op, "a_scale", a_scale, m, m, k, a.device)
    b_form = check_scale_form(op, "b_scale", b_scale, n, scale_blocks(n), k, a.device)
    _check_out_dtype(op, out_dtype, SCALED_OUT_DTYPES)
    _check_bias(op, bias, n, tuple(dict.fromkeys((torch.float32, out_dtype))), a.device)
    c = torch.empty(m, n, dtype=out_dtype, device=a.device)
    if m == 0 or n == 0:
        return c
    meta, launch = tiles(tuning, "scaled_gemm", m, n, k, least_k=32)
    meta.setdefault("GROUP_M", 8)
    if "block" in (a_form, b_form):  # one K step must stay inside one 128-block of scales
        meta["BLOCK_K"] = min(meta["BLOCK_K"], SCALE_BLOCK)
    # scale strides: a per-tensor scale is read at offset 0; [M, 1] / [R, KB] through their strides
    sa = a_scale.reshape(1, 1) if a_form == "tensor" else a_scale
    sb = b_scale.reshape(1, 1) if b_form == "tensor" else b_scale
    grid = (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)
    kern._scaled_gemm_kernel[grid](
        a, b, sa, sb, bias if bias is not None else c, c, m, n, k,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), sa.stride(0), sa.stride(1), sb.stride(0), sb.stride(1),
        c.stride(0), c.stride(1),
        A_FORM=_FORMS[a_form], B_FORM=_FORMS[b_form], SCALE_BLOCK=SCALE_BLOCK,
        IS_INT=a.dtype == torch.int8, HAS_BIAS=bias is not None, SOFT_RTNE=interpreted(tuning), **meta, **launch,
    )  # fmt: skip
    return c


def grouped_gemm(a, b, group_ends, *, out_dtype=None, b_scale=None, b_zero_point=None, group_size=None, tuning):
    g = int4.check_int4_grouped(a, b, group_ends, out_dtype, (b_scale, b_zero_point, group_size))
    if g is not None:  # spec 1.9: packed int4 b (W4A16)
        return int4.grouped_gemm(a, b, b_scale, b_zero_point, g, group_ends, out_dtype=out_dtype, tuning=tuning)
    op = "grouped_gemm"
    check_operands(op, a, b, FLOAT_DTYPES, b_ndim=3)
    out_dtype = a.dtype if out_dtype is None else out_dtype
    _check_out_dtype(op, out_dtype, FLOAT_DTYPES)
    check_tensor(op, "group_ends", group_ends, shape=(b.shape[0],), dtypes=(torch.int32, torch.int64))
    expect(group_ends.device == a.device, op, "group_ends", f"device {a.device} (that of 'a')", group_ends.device)
    c = torch.empty(a.shape[0], b.shape[1], dtype=out_dtype, device=a.device)
    return launch_grouped(a, b, group_ends, c, tuning=tuning)
