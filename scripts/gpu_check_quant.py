"""The quantized cases of scripts/gpu_check.py (spec 1.4) at DeepSeek-V3's shapes, and a separate side-by-side
timing of ``torch._scaled_grouped_mm`` (PyTorch's row-wise fp8 grouped GEMM) on the row-wise case.

- quantize_activation: T tokens x H 7168, fp8 1x128 groups (float and ue8m0 scales) and int8 per token.
- scaled_grouped_gemm: the routed rows of T tokens at top-8 (4096 x 8 = 32768) over E 256 experts,
  gate_up (N 4096, K 7168) and down (N 7168, K 2048) with 128x128 block scales, and gate_up row-wise
  (per-token x per-channel scales, the form torch._scaled_grouped_mm takes).
- fused_moe: DeepSeek-V3's fp8 experts (128x128 weight blocks, 1x128 activation groups).

Bytes count the weights of the experts that receive tokens only (all 256 at 32768 rows; few at T = 1).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from gpu_check_sizes import BF16, Bench, Sizes, nbytes, randn

__all__ = ["quant_benches", "vendor_section", "VENDOR_CASE"]

FP8 = torch.float8_e4m3fn
VENDOR_CASE = "row-wise"  # the scaled_grouped_gemm case also timed through torch._scaled_grouped_mm


def quantized(shape: tuple[int, ...], device, dtype: torch.dtype) -> torch.Tensor:
    """Random values of an fp8 or int8 dtype, drawn in bfloat16 slices of about 2**28 elements along dim 0
    (a 7 GiB fp8 weight never has a 14 GiB bfloat16 copy); uninitialised on the meta device."""
    out = torch.empty(shape, device=device, dtype=dtype)
    if out.device.type == "meta":
        return out
    step = max(1, 2**28 // max(1, math.prod(shape[1:])))
    for i in range(0, shape[0], step):
        x = torch.randn((min(step, shape[0] - i), *shape[1:]), device=device, dtype=BF16).mul_(32)
        out[i : i + step] = x.round_().clamp_(-127, 127).to(dtype) if dtype == torch.int8 else x.to(dtype)
    return out


def _scale(shape: tuple[int, ...], device, base: float) -> torch.Tensor:
    return torch.rand(shape, device=device).add_(0.5).mul_(base)


def _routed(tokens: int, e: int, k: int, device) -> tuple[torch.Tensor, int]:
    """(group ends int32 [E] of the routed rows, the number of experts that receive a row), drawn on the CPU."""
    ids = torch.rand(tokens, e).topk(k, dim=1).indices
    counts = torch.bincount(ids.reshape(-1), minlength=e)
    return counts.cumsum(0).to(torch.int32).to(device), int((counts > 0).sum())


def _quantize(t: int, h: int, dtype: torch.dtype, group: int | None, fmt: str) -> Callable:
    def make(dev):
        x = randn((t, h), dev)
        groups = 1 if group is None else math.ceil(h / group)
        inputs = {"x": x, "dtype": dtype, "group_size": group, "scale_fmt": fmt}
        return inputs, 3.0 * t * h, nbytes(x) + t * h + 4.0 * t * groups

    return make


def _grouped(t: int, e: int, k: int, n: int, kk: int, form: str) -> Callable:
    rows, nb, kb = t * k, math.ceil(n / 128), math.ceil(kk / 128)

    def make(dev):
        a, b = quantized((rows, kk), dev, FP8), quantized((e, n, kk), dev, FP8)
        ends, used = _routed(t, e, k, dev)
        block = form == "block"
        sa = _scale((rows, kb) if block else (rows, 1), dev, 2e-3)
        sb = _scale((e, nb, kb) if block else (e, n, 1), dev, 1e-4)
        inputs = {"a": a, "b": b, "a_scale": sa, "b_scale": sb, "group_ends": ends, "out_dtype": BF16}
        moved = nbytes(a, sa, ends) + used * (n * kk + nbytes(sb) / e) + rows * n * 2
        return inputs, 2.0 * rows * n * kk, moved

    return make


def _fused_fp8(t: int, e: int, k: int, h: int, i: int) -> Callable:
    def make(dev):
        x = randn((t, h), dev)
        w13, w2 = quantized((e, 2 * i, h), dev, FP8), quantized((e, h, i), dev, FP8)
        s13 = _scale((e, math.ceil(2 * i / 128), math.ceil(h / 128)), dev, 1e-4)
        s2 = _scale((e, math.ceil(h / 128), math.ceil(i / 128)), dev, 1e-4)
        ids = torch.rand(t, e).topk(k, dim=1).indices.to(torch.int32)
        used = int(torch.unique(ids).numel())
        inputs = {
            "x": x,
            "w13": w13,
            "w2": w2,
            "weights": torch.rand(t, k, device=dev),
            "ids": ids.to(dev),
            "w13_scale": s13,
            "w2_scale": s2,
            "act_quant": "group128",
        }
        per_expert = 3 * i * h + (nbytes(s13) + nbytes(s2)) / e
        return inputs, 2.0 * t * k * 3 * i * h, used * per_expert + 2 * nbytes(x) + t * k * 8

    return make


def quant_benches(s: Sizes) -> list[Bench]:
    """quantize_activation, scaled_grouped_gemm and fused_moe's fp8 mode at DeepSeek-V3's shapes."""
    e, k, h, i = s.experts["deepseek-v3"]
    t = s.quant_tokens
    pre = f"deepseek-v3 T{t}"
    out = [
        Bench("quantize_activation", f"{pre} K{h} group128 fp8", "float8_e4m3fn", _quantize(t, h, FP8, 128, "float")),
        Bench(
            "quantize_activation", f"{pre} K{h} group128 fp8 ue8m0", "float8_e4m3fn", _quantize(t, h, FP8, 128, "ue8m0")
        ),
        Bench("quantize_activation", f"{pre} K{h} per-token int8", "int8", _quantize(t, h, torch.int8, None, "float")),
    ]
    rows = f"E{e} rows{t * k}"
    out += [
        Bench(
            "scaled_grouped_gemm",
            f"{pre} gate_up 128-blocks {rows} N{2 * i} K{h}",
            "float8_e4m3fn",
            _grouped(t, e, k, 2 * i, h, "block"),
        ),
        Bench(
            "scaled_grouped_gemm",
            f"{pre} down 128-blocks {rows} N{h} K{i}",
            "float8_e4m3fn",
            _grouped(t, e, k, h, i, "block"),
        ),
        Bench(
            "scaled_grouped_gemm",
            f"{pre} gate_up {VENDOR_CASE} {rows} N{2 * i} K{h}",
            "float8_e4m3fn",
            _grouped(t, e, k, 2 * i, h, "row"),
        ),
    ]
    out += [
        Bench(
            "fused_moe",
            f"deepseek-v3 fp8 128-blocks T{m} E{e} top{k} H{h} I{i}",
            "float8_e4m3fn",
            _fused_fp8(m, e, k, h, i),
        )
        for m in s.moe_tokens
    ]
    return out


# ----------------------------------------------------------------------------- torch._scaled_grouped_mm, side by side


def torch_grouped_args(inputs: dict[str, Any]) -> dict[str, Any]:
    """hetero's row-wise scaled_grouped_gemm inputs as torch._scaled_grouped_mm's: mat_b [G, K, N] column-major
    (b's transposed view), scale_a [M], scale_b [G, N], offs the int32 group ends."""
    b, sb = inputs["b"], inputs["b_scale"]
    return {
        "mat_a": inputs["a"],
        "mat_b": b.transpose(-2, -1),
        "scale_a": inputs["a_scale"].reshape(-1).contiguous(),
        "scale_b": sb.reshape(sb.shape[0], -1).contiguous(),
        "offs": inputs["group_ends"],
        "out_dtype": BF16,
    }


def _compare(bench: Bench, ops: Any, timer: Callable, device) -> str:
    try:
        inputs, flops, _ = bench.make(device)
        targs = torch_grouped_args(inputs)
        fn = getattr(ops, bench.op)

        def vendor():
            return torch._scaled_grouped_mm(
                targs["mat_a"],
                targs["mat_b"],
                targs["scale_a"],
                targs["scale_b"],
                offs=targs["offs"],
                out_dtype=targs["out_dtype"],
            )

        got, want = fn(**inputs).double(), vendor().double()
        err = float((got - want).norm() / want.norm().clamp_min(1e-30))
        mine, theirs = timer(lambda: fn(**inputs)), timer(vendor)
        return (
            f"| {bench.case} | {mine:.4g} | {theirs:.4g} | {mine / theirs:.2f}x | "
            f"{flops / theirs / 1e9:.0f} | {err:.2e} |"
        )
    except Exception as e:  # noqa: BLE001  (report and go on)
        return f"| {bench.case} | error: {type(e).__name__}: {str(e).splitlines()[0][:160]} | | | | |"


def vendor_section(s: Sizes, ops: Any, timer: Callable, device) -> str:
    """A Markdown section timing hetero's row-wise fp8 scaled_grouped_gemm beside torch._scaled_grouped_mm
    (a vendor reference, not a hetero path: cuBLASLt/CUTLASS row-wise grouped GEMM, sm90+)."""
    lines = ["", "## Side by side: torch._scaled_grouped_mm (row-wise fp8)", ""]
    if device.type != "cuda" or not hasattr(torch, "_scaled_grouped_mm"):
        why = "not a CUDA device" if device.type != "cuda" else f"torch {torch.__version__} has no _scaled_grouped_mm"
        return "\n".join(lines + [f"- skipped: {why}", ""])
    lines += [
        "- the same inputs: a [M, K] fp8 with per-token scales, b [G, N, K] fp8 with per-channel scales, "
        "bfloat16 output; rel err = hetero vs torch",
        "",
        "| case | hetero ms | torch._scaled_grouped_mm ms | hetero / torch | torch TFLOP/s | rel err |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for bench in quant_benches(s):
        if bench.op == "scaled_grouped_gemm" and VENDOR_CASE in bench.case:
            lines.append(_compare(bench, ops, timer, device))
            torch.cuda.empty_cache()
    return "\n".join(lines) + "\n"
