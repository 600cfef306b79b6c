"""rms_norm (without a gate), silu_and_mul and rotary_embedding (a float32 cos/sin table) for CPU
float32 and bfloat16 through hetero-torch's native kernels (``csrc/layers.cpp``, part of ``_native``'s extension).

One pass over each row in float32 and one rounding, where torch's operators make a float32 copy of
the rows and a temporary per step of the formula (at a prefill's thousands of rows, fresh pages on
every call). The ops are ``torch.ops.hetero_torch_native`` ops with fake kernels, so torch.compile
keeps them in its graph; elsewhere (another dtype or device, autograd, the extension off or not
built) the callers keep torch's operators.
"""

from __future__ import annotations

import functools

import torch

from hetero_torch._native import DTYPES, extension
from hetero_torch._native import rows as _rows
from hetero_torch._traced import constant_when_traced

__all__ = ["norm_applies", "act_applies", "rotary_applies", "rms_norm", "silu_and_mul", "rotary_embedding"]


@functools.cache
def _registered() -> bool:
    module, _ = extension()
    if module is None:
        return False

    @torch.library.register_fake("hetero_torch_native::rms_norm")
    def _(x, weight, eps, residual, offset):
        return torch.empty_like(x), torch.empty_like(x) if residual is not None else x.new_empty(0)

    @torch.library.register_fake("hetero_torch_native::silu_and_mul")
    def _(x):
        return x.new_empty(x.shape[0], x.shape[1] // 2)

    @torch.library.register_fake("hetero_torch_native::rotary_embedding")
    def _(positions, q, k, cache, is_neox):
        return q.new_empty(q.shape), k.new_empty(k.shape)

    return True


@constant_when_traced
def _built() -> bool:
    return _registered()


def _plain(t: torch.Tensor, dtype: torch.dtype) -> bool:
    return t.device.type == "cpu" and t.dtype == dtype and not t.requires_grad


def norm_applies(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> bool:
    """x (and residual) all float32 or all bfloat16 on the CPU, weight of x's dtype or float32."""
    return (
        x.dtype in DTYPES
        and _plain(x, x.dtype)
        and (_plain(weight, x.dtype) or _plain(weight, torch.float32))
        and (residual is None or _plain(residual, x.dtype))
        and _built()
    )


def act_applies(x: torch.Tensor) -> bool:
    return x.dtype in DTYPES and _plain(x, x.dtype) and _built()


def rotary_applies(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cache: torch.Tensor) -> bool:
    """q and k both float32 or both bfloat16 on the CPU, the table float32 (the engine's)."""
    return (
        q.dtype in DTYPES
        and _plain(q, q.dtype)
        and _plain(k, q.dtype)
        and _plain(cache, torch.float32)
        and positions.device.type == "cpu"
        and _built()
    )


def rotary_embedding(positions, q, k, cache, is_neox: bool):
    """New (q, k) for inputs ``rotary_applies`` takes, shapes checked (positions are clamped into the table)."""
    return torch.ops.hetero_torch_native.rotary_embedding(
        positions.contiguous(), _rows(q), _rows(k), cache.contiguous(), is_neox
    )


def rms_norm(x, weight, eps: float, residual, offset: float):
    """The op's result for inputs ``norm_applies`` takes: out, or (out, x + residual)."""
    width = x.shape[-1]
    rows = x.reshape(-1, width).contiguous()
    res = None if residual is None else residual.reshape(-1, width).contiguous()
    out, h = torch.ops.hetero_torch_native.rms_norm(rows, weight.contiguous(), eps, res, offset)
    return out.view(x.shape) if residual is None else (out.view(x.shape), h.view(x.shape))


def silu_and_mul(x):
    """The op's result for an x ``act_applies`` takes (its last dimension even)."""
    width = x.shape[-1]
    return torch.ops.hetero_torch_native.silu_and_mul(x.reshape(-1, width).contiguous()).view(*x.shape[:-1], width // 2)
