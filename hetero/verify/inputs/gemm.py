"""Inputs of the GEMM cases: plain, scaled (fp8 / int8, per tensor, row or block) and grouped."""

from __future__ import annotations

import math

import torch

from hetero.verify.inputs.draw import randn

__all__ = ["BLOCK", "gemm", "grouped", "scaled"]

BLOCK = 128  # hetero.spec.gemm.SCALE_BLOCK


# ---------------------------------------------------------------- gemm


def gemm(m: int, n: int, k: int, *, bias: bool = False, view: str = "", out_dtype: torch.dtype | None = None):
    """a [m, k] activations, b [n, k] weights scaled like a trained layer (outputs of order 1).

    view: "" (contiguous a), "rows" (a is the first k columns of a wider packed
    buffer: row stride > k), "cols" (every second column: element stride 2).
    """

    def build(gen: torch.Generator, dtype: torch.dtype):
        if view == "rows":
            a = randn(gen, (m, k + 384), dtype)[:, :k]
        elif view == "cols":
            a = randn(gen, (m, 2 * k), dtype)[:, ::2]
        else:
            a = randn(gen, (m, k), dtype)
        args = {"a": a, "b": randn(gen, (n, k), dtype, 1 / math.sqrt(k))}
        if bias:
            args["bias"] = randn(gen, (n,), dtype, 0.5)
        if out_dtype is not None:
            args["out_dtype"] = out_dtype
        return args

    return build


# ---------------------------------------------------------------- scaled_gemm


def _qmax(qdtype: torch.dtype) -> float:
    return 127.0 if qdtype == torch.int8 else float(torch.finfo(qdtype).max)


def _blocks(n: int) -> int:
    return -(-n // BLOCK)


def _quantize(x: torch.Tensor, qdtype: torch.dtype, form: str, weight: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize float32 x [R, K] to qdtype with scales of ``form`` (amax / qmax per tensor, row or block).

    form: "tensor" (scale shape [1] for activations, [] for weights), "row"
    ([R, 1]) or "block" (activations [R, ceil(K/128)], weights [ceil(R/128), ceil(K/128)]).
    """
    rows, k = x.shape
    qmax = _qmax(qdtype)
    if form == "tensor":
        amax = x.abs().amax().clamp_min(1e-12)
        scale = (amax / qmax).reshape(()) if weight else (amax / qmax).reshape(1)
        full = scale.reshape(1, 1).expand(rows, k)
    elif form == "row":
        scale = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / qmax
        full = scale.expand(rows, k)
    else:
        kb = _blocks(k)
        rb = _blocks(rows) if weight else rows
        rpad = rb * BLOCK - rows if weight else 0
        padded = torch.nn.functional.pad(x.abs(), (0, kb * BLOCK - k, 0, rpad))
        if weight:
            amax = padded.reshape(rb, BLOCK, kb, BLOCK).amax(dim=(1, 3))
        else:
            amax = padded.reshape(rows, kb, BLOCK).amax(dim=2)
        scale = amax.clamp_min(1e-12) / qmax
        full = scale.repeat_interleave(BLOCK, dim=1)[:, :k]
        if weight:
            full = full.repeat_interleave(BLOCK, dim=0)[:rows]
    y = (x / full).clamp(-qmax, qmax)
    if qdtype == torch.int8:
        y = y.round()
    return y.to(qdtype), scale.float().contiguous()


def _activations(gen: torch.Generator, m: int, k: int) -> torch.Tensor:
    """LLM-like activations: per-channel magnitudes vary (log-normal) and a few channels are 10x outliers."""
    chan = torch.exp(0.6 * torch.randn(k, generator=gen))
    chan[torch.randperm(k, generator=gen)[: max(1, k // 256)]] *= 10
    return randn(gen, (m, k), torch.float32) * chan


def _weights(gen: torch.Generator, n: int, k: int) -> torch.Tensor:
    """Weights of a trained layer: std ~ 1/sqrt(k), varying per output channel and per input column block."""
    rowmag = torch.exp(0.4 * torch.randn(n, 1, generator=gen))
    colmag = torch.exp(0.4 * torch.randn(1, k, generator=gen))
    return randn(gen, (n, k), torch.float32, 1 / math.sqrt(k)) * rowmag * colmag


def scaled(
    m: int,
    n: int,
    k: int,
    a_form: str,
    b_form: str,
    *,
    bias: torch.dtype | None = None,
    out_dtype: torch.dtype | None = None,
):
    def build(gen: torch.Generator, qdtype: torch.dtype):
        a, a_scale = _quantize(_activations(gen, m, k), qdtype, a_form, weight=False)
        b, b_scale = _quantize(_weights(gen, n, k), qdtype, b_form, weight=True)
        args = {"a": a, "b": b, "a_scale": a_scale, "b_scale": b_scale}
        if bias is not None:
            args["bias"] = randn(gen, (n,), bias, 0.5)
        if out_dtype is not None:
            args["out_dtype"] = out_dtype
        return args

    return build


# ---------------------------------------------------------------- grouped_gemm


def _group_ends(gen: torch.Generator, rows: int, groups: int, empty: tuple[int, ...], only: int | None) -> torch.Tensor:
    """Cumulative row counts of ``rows`` rows spread at random over the groups not in ``empty``
    (or all in group ``only``); every group allowed to hold rows gets at least one when rows suffice."""
    if only is not None:
        counts = torch.zeros(groups, dtype=torch.int64)
        counts[only] = rows
    else:
        allowed = torch.tensor([g for g in range(groups) if g not in empty])
        counts = torch.zeros(groups, dtype=torch.int64)
        base = min(1, rows // len(allowed))
        counts[allowed] = base
        rest = rows - base * len(allowed)
        if rest:
            pick = allowed[torch.randint(0, len(allowed), (rest,), generator=gen)]
            counts += torch.bincount(pick, minlength=groups)
    return counts.cumsum(0).to(torch.int32)


def grouped(
    rows: int,
    groups: int,
    n: int,
    k: int,
    *,
    tail: int = 0,
    empty: tuple[int, ...] = (),
    only: int | None = None,
    out_dtype: torch.dtype | None = None,
):
    """a [rows + tail, k]: ``rows`` rows in groups, then ``tail`` rows past group_ends[-1] (zero in the output)."""

    def build(gen: torch.Generator, dtype: torch.dtype):
        ends = _group_ends(gen, rows, groups, tuple(g % groups for g in empty), only)
        args = {
            "a": randn(gen, (rows + tail, k), dtype),
            "b": randn(gen, (groups, n, k), dtype, 1 / math.sqrt(k)),
            "group_ends": ends,
        }
        if out_dtype is not None:
            args["out_dtype"] = out_dtype
        return args

    return build
