"""The oracle: the reference backend on float64 copies of a case's inputs."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._pytree import tree_map_only

from hetero.backend import Backend
from hetero.spec.gemm import SCALE_BLOCK

__all__ = ["to_float64", "run_oracle", "clone_inputs", "to_device"]

_WIDEN = (torch.float16, torch.bfloat16, torch.float32)


def _map(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    # the spec's metadata types are pytrees (hetero.spec.types), so their tensors are reached too
    return tree_map_only(torch.Tensor, fn, value)


def to_float64(inputs: dict[str, Any]) -> dict[str, Any]:
    """Floating tensors widened to float64; integer, fp8 and int8 tensors kept as they are."""
    return {k: _map(v, lambda t: t.to(torch.float64) if t.dtype in _WIDEN else t.clone()) for k, v in inputs.items()}


def clone_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    """Copies of every tensor, inside metadata types too; everything else shared."""
    return {k: _map(v, lambda t: t.clone()) for k, v in inputs.items()}


def to_device(inputs: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Copies of every tensor on ``device``, strides kept (non-contiguous views stay non-contiguous)."""

    def move(t: torch.Tensor) -> torch.Tensor:
        if t.is_contiguous() or 0 in t.stride():  # expanded views cannot be copied into in place
            return t.clone().to(device)
        base = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=device)
        base.copy_(t)
        return base

    return {k: _map(v, move) for k, v in inputs.items()}


def _dequant(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x * its scale in float64, the scale's form told by its shape (see hetero.spec.gemm.scaled_gemm)."""
    rows, cols = x.shape
    s = scale.to(torch.float64)
    if s.numel() == 1:
        return x.to(torch.float64) * s.reshape(())
    if s.shape[1] > 1 or s.shape[0] != rows:  # block-wise
        s = s.repeat_interleave(SCALE_BLOCK, dim=1)[:, :cols]
        if s.shape[0] != rows:
            s = s.repeat_interleave(SCALE_BLOCK, dim=0)[:rows]
    return x.to(torch.float64) * s


def _dequant_grouped(inputs: dict[str, Any]) -> dict[str, Any]:
    """scaled_grouped_gemm's operands dequantized in float64, as grouped_gemm's arguments."""
    a, b, sa, sb = inputs["a"], inputs["b"], inputs["a_scale"], inputs["b_scale"]
    zp = inputs.get("a_zero_point")
    a64 = a.to(torch.float64) if zp is None else a.to(torch.float64) - zp.to(torch.float64)
    b64 = torch.stack([_dequant(b[g], sb[g].reshape(1, 1) if sb.ndim == 1 else sb[g]) for g in range(b.shape[0])])
    return {"a": _dequant(a64, sa), "b": b64, "group_ends": inputs["group_ends"]}


def run_oracle(reference: Backend, op: str, inputs: dict[str, Any], call) -> tuple[Any, dict[str, Any]]:
    """The float64 result of ``op`` on ``inputs`` and the arguments it was called with (an
    in-place op's outputs are among them); ``call(fn, inputs)`` invokes an implementation."""
    if op == "scaled_gemm":
        a = _dequant(inputs["a"], inputs["a_scale"])
        b = _dequant(inputs["b"], inputs["b_scale"])
        bias = inputs.get("bias")
        return reference.gemm(a, b, bias=None if bias is None else bias.to(torch.float64)), inputs
    if op == "scaled_grouped_gemm":
        return reference.grouped_gemm(**_dequant_grouped(inputs)), inputs
    wide = to_float64(inputs)
    return call(getattr(reference, op), wide), wide
