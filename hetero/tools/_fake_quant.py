"""transformers as the oracle of an 8-bit checkpoint (``check-model``): its dequantized float copy, with each
GEMM input quantized and dequantized exactly as the engine's method quantizes it.

The engine's ``QuantConfig`` says which layers quantize their inputs; transformers' modules are mapped to
the engine's prefixes (q/k/v -> qkv_proj, gate/up -> gate_up_proj, fused experts -> experts). The
model must run its experts through ``F.linear`` (``experts_implementation="eager"``).
"""

from __future__ import annotations

import contextlib
import re
from typing import Any, Iterator

import torch

__all__ = ["quantized_inputs"]

_PACKED = {
    "q_proj": "qkv_proj",
    "k_proj": "qkv_proj",
    "v_proj": "qkv_proj",
    "gate_proj": "gate_up_proj",
    "up_proj": "gate_up_proj",
}
_GROUP = {"group128": 128, "token": None}


def _engine_prefix(name: str) -> tuple[str, bool]:
    """(engine prefix, is_experts) of transformers parameter ``name`` (``...q_proj.weight``,
    ``...experts.down_proj``)."""
    module = name.removesuffix(".weight")
    m = re.fullmatch(r"(.*\.experts)\.(gate_up_proj|down_proj)", module)
    if m:
        return m[1], True
    head, _, last = module.rpartition(".")
    return (f"{head}.{_PACKED.get(last, last)}" if head else last), False


def _act_quant(config: Any, name: str) -> tuple[str | None, str]:
    """(act_quant, scale_fmt) the engine applies to the input of transformers parameter ``name``'s GEMM."""
    prefix, experts = _engine_prefix(name)
    method = config.moe_method(prefix) if experts else config.linear_method(prefix)
    scheme = getattr(method, "scheme", None)
    return (scheme.act_quant, scheme.scale_fmt) if scheme is not None else (None, "float")


def _ranges(model: torch.nn.Module, config: Any) -> list[tuple[int, int, str | None, str, torch.dtype]]:
    out = []
    for name, p in model.named_parameters():
        if p.ndim in (2, 3) and name.endswith(("weight", "_proj")) and "embed" not in name:
            act, fmt = _act_quant(config, name)
            dtype = config.scheme.dtype
            start = p.data_ptr()
            out.append((start, start + p.numel() * p.element_size(), act, fmt, dtype))
    return out


@contextlib.contextmanager
def quantized_inputs(model: torch.nn.Module, config: Any, ops: Any) -> Iterator[None]:
    """Inside: ``F.linear`` on a weight of ``model`` quantizes its input as the engine's ``config`` does for that
    layer (``ops.quantize_activation``, then dequantized in float32); other inputs pass unchanged."""
    F = torch.nn.functional
    ranges, linear = _ranges(model, config), F.linear

    def fake(x: torch.Tensor, act: str, fmt: str, dtype: torch.dtype) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        group = _GROUP[act]
        q, s = ops.quantize_activation(flat, dtype=dtype, group_size=group, scale_fmt=fmt)[:2]
        full = s.repeat_interleave(group, dim=1)[:, : flat.shape[1]] if group else s
        return (q.to(torch.float32) * full).to(x.dtype).reshape(x.shape)

    def patched(x, weight, bias=None):
        ptr = weight.data_ptr()
        hit = next((r for r in ranges if r[0] <= ptr < r[1]), None)
        if hit is not None and hit[2] is not None:
            x = fake(x, hit[2], hit[3], hit[4])
        return linear(x, weight, bias)

    F.linear = patched
    try:
        yield
    finally:
        F.linear = linear
