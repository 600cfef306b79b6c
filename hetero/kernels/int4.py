"""Packed int4 weights (W4A16, spec 1.9): the Triton paths of gemm, grouped_gemm and fused_moe.

``hetero.kernels.gemm`` and ``hetero.kernels.moe`` hand a call here when its weight is uint8 (after the
checks here: a float weight with an int4 option is refused by name). The weight is dequantized tile by
tile inside the K loop of the kernels in ``hetero.kernels._int4_kernels``; nothing is dequantized into
memory. fused_moe's packed experts are its usual composition (the stable sort, the two grouped GEMMs
with the gather and the activation epilogue, the weighted combine) with the int4 grouped kernel.

Tiles come from the tuning table's ``int4_gemm``, ``int4_grouped_gemm`` and ``int4_fused_moe``
entries over this module's defaults. On hardware a power-of-two group size of 16 or more caps
BLOCK_K at the group size, so that each K step reads one scale (and zero point) per output column;
the interpreter keeps its large K steps and finds each column's group per element.
"""

from __future__ import annotations

import torch

from hetero.kernels._int4_checks import check_int4_gemm, check_int4_grouped, check_int4_moe
from hetero.kernels._int4_kernels import int4_gemm_kernel, int4_grouped_kernel
from hetero.kernels._triton import interpreter_requested, triton_modules
from hetero.kernels.tuning import Tuning

triton, tl = triton_modules()

__all__ = [
    "check_int4_gemm",
    "check_int4_grouped",
    "check_int4_moe",
    "gemm",
    "grouped_gemm",
    "launch_int4_grouped",
    "int4_experts",
    "DEFAULTS",
    "INTERPRETED",
]

#: Launch parameters when the tuning table has none (untimed: tiles that ptxas fits in registers for sm90
#: without spilling, 128-170 registers a thread with bf16 / fp16 activations and one scale row a step).
DEFAULTS = {
    "int4_gemm": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 3},
    "int4_grouped_gemm": {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 3},
    "int4_fused_moe": {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 3},
}
#: The interpreter pays per program and per operation, not per element: one K step where the tile fits
#: (the dequantized tile, BLOCK_K x BLOCK_N, stays within Triton's 2**20 elements: BLOCK_K gives way first).
INTERPRETED = {
    "int4_gemm": {"BLOCK_M": 64, "BLOCK_N": 1024, "BLOCK_K": 8192},
    "int4_grouped_gemm": {"BLOCK_M": 8, "BLOCK_N": 1024, "BLOCK_K": 8192},
    "int4_fused_moe": {"BLOCK_M": 4, "BLOCK_N": 4096, "BLOCK_K": 8192},
}
_MAX_BLOCK = 1 << 20  # Triton's largest block: the dequantized tile is BLOCK_K x BLOCK_N
_GS_MAX = 1 << 30  # a group size past K is one group; kept inside int32


def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def _interpreted(tuning: Tuning) -> bool:
    return tuning.interpreted or interpreter_requested()


def _tiles(tuning: Tuning, kernel: str, a_dtype, m: int, n: int, k: int, group_size: int) -> tuple[dict, dict, int]:
    """(BLOCK_M/N/K, GROUP_M when tiled in bands and ALIGNED constexprs; launch options; the GS argument)."""
    interp = _interpreted(tuning)
    params = {**DEFAULTS[kernel], **(INTERPRETED[kernel] if interp else {}), **tuning(kernel)}
    meta, launch = Tuning.launch_options(params)
    out = {
        "BLOCK_M": max(1 if interp else 16, min(int(meta["BLOCK_M"]), _pow2(m))),
        "BLOCK_N": max(16, min(int(meta["BLOCK_N"]), _pow2(n))),
        "BLOCK_K": max(16, min(int(meta["BLOCK_K"]), _pow2(k))),
    }
    if "GROUP_M" in meta:
        out["GROUP_M"] = int(meta["GROUP_M"])
    while out["BLOCK_K"] * out["BLOCK_N"] > _MAX_BLOCK and out["BLOCK_K"] > 16:
        out["BLOCK_K"] //= 2
    if not interp and a_dtype == torch.float32:  # the IEEE float32 dot runs on FMAs, out of registers beyond
        out["BLOCK_M"] = 16  # 16 rows (ptxas, sm90: 64 rows spill 0.5-1 KB a thread)
    gs = min(group_size, _GS_MAX)
    if not interp and gs >= 16 and gs & (gs - 1) == 0:
        out["BLOCK_K"] = min(out["BLOCK_K"], gs)
    out["ALIGNED"] = gs >= k or gs % out["BLOCK_K"] == 0
    return out, launch, gs


def _flags(a: torch.Tensor, out_dtype: torch.dtype, tuning: Tuning) -> dict:
    """TERMS (how many 16-bit terms carry w for a 16-bit a; 0: float32 dot), the interpreter's bf16 workarounds."""
    interp = _interpreted(tuning)
    terms = 0 if a.dtype not in (torch.float16, torch.bfloat16) else 2
    if a.dtype == torch.bfloat16 and out_dtype not in (torch.float16, torch.bfloat16):
        terms = 3
    return {
        "TERMS": terms,
        "UPCAST": interp and a.dtype == torch.bfloat16,
        "SOFT_RTNE": interp,
    }


def gemm(a, b, b_scale, b_zero_point, g: int, *, bias=None, out_dtype=None, tuning: Tuning) -> torch.Tensor:
    """``gemm`` with packed int4 b [N, ceil(K/2)] and group size g, checked by ``check_int4_gemm``."""
    out_dtype = a.dtype if out_dtype is None else out_dtype
    (m, k), n = a.shape, b.shape[0]
    c = torch.empty(m, n, dtype=out_dtype, device=a.device)
    if m == 0 or n == 0:
        return c
    meta, launch, gs = _tiles(tuning, "int4_gemm", a.dtype, m, n, k, g)
    meta.setdefault("GROUP_M", 8)
    zp = b_zero_point if b_zero_point is not None else b_scale
    grid = (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)
    int4_gemm_kernel[grid](
        a, b, b_scale, zp, bias if bias is not None else c, c, m, n, k, gs,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), b_scale.stride(0), b_scale.stride(1),
        zp.stride(0), zp.stride(1), c.stride(0), c.stride(1),
        HAS_ZP=b_zero_point is not None, HAS_BIAS=bias is not None, **_flags(a, c.dtype, tuning), **meta, **launch,
    )  # fmt: skip
    return c


def launch_int4_grouped(
    a, b, scale, zero_point, gs: int, group_ends, c, *, tuning: Tuning, kernel: str = "int4_grouped_gemm",
    perm=None, topk: int = 1, swiglu: bool = False, act: tuple = (0, 0.0, 0.0), bias=None,
) -> torch.Tensor:  # fmt: skip
    """c[rows] = the grouped product of a's rows (through perm) and the dequantized b[g] (see
    ``int4_grouped_kernel``); K is a's column count, c's row count M. Returns c."""
    m, n = c.shape
    groups, k = b.shape[0], a.shape[1]
    if m == 0 or n == 0:
        return c
    meta, launch, gs = _tiles(tuning, kernel, a.dtype, m, n, k, gs)
    bm = meta["BLOCK_M"]
    grid = (triton.cdiv(m, bm) + min(groups + 1, m), triton.cdiv(n, meta["BLOCK_N"]))
    zp = zero_point if zero_point is not None else scale
    bias_at = bias if bias is not None else group_ends
    code, alpha, limit = act
    int4_grouped_kernel[grid](
        a, b, scale, zp, c, group_ends, perm if perm is not None else group_ends, bias_at,
        m, n, k, groups, gs, topk, a.shape[0], float(alpha), float(limit),
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), b.stride(2),
        scale.stride(0), scale.stride(1), scale.stride(2), zp.stride(0), zp.stride(1), zp.stride(2),
        c.stride(0), c.stride(1), group_ends.stride(0), bias_at.stride(0), bias_at.stride(-1),
        HAS_ZP=zero_point is not None, GATHER=perm is not None, SWIGLU=swiglu, ACT=int(code),
        HAS_BIAS=bias is not None, G_POW2=_pow2(groups), **_flags(a, c.dtype, tuning), **meta, **launch,
    )  # fmt: skip
    return c


def grouped_gemm(a, b, b_scale, b_zero_point, g: int, group_ends, *, out_dtype=None, tuning: Tuning) -> torch.Tensor:
    """``grouped_gemm`` with packed int4 b [G, N, ceil(K/2)] and group size g, checked by ``check_int4_grouped``."""
    c = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype if out_dtype is None else out_dtype, device=a.device)
    return launch_int4_grouped(a, b, b_scale, b_zero_point, g, group_ends, c, tuning=tuning)


def int4_experts(x, w13, w2, opts, group_size: int, ends, perm, topk: int, act, w13_bias, w2_bias, tuning: Tuning):
    """y_sorted [P, H] in x's dtype: both packed expert GEMMs over the P pairs sorted by expert
    (``opts`` as ``check_int4_moe``'s, which checked them); the first gathers x through perm and applies
    bias, rounding and the activation in its epilogue, the second adds w2's bias."""
    w13_scale, w2_scale, _, _, z13, z2, _ = opts
    pairs = perm.numel()
    h = x.new_empty(pairs, w13.shape[1] // 2)
    launch_int4_grouped(
        x, w13, w13_scale, z13, group_size, ends, h, tuning=tuning, kernel="int4_fused_moe",
        perm=perm, topk=topk, swiglu=True, act=act, bias=w13_bias,
    )  # fmt: skip
    y_sorted = x.new_empty(pairs, x.shape[1])
    return launch_int4_grouped(
        h, w2, w2_scale, z2, group_size, ends, y_sorted, tuning=tuning, kernel="int4_fused_moe", bias=w2_bias
    )
