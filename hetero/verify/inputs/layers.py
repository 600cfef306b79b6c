"""Inputs of the layer-op cases: rms_norm, layer_norm, rotary_embedding, silu_and_mul."""

from __future__ import annotations

import torch

from hetero.verify.inputs.draw import randn

__all__ = ["layer_norm", "rms", "rms_options", "rotary", "silu"]


def rms(tokens: int, hidden: int, residual: bool, noncontig: bool):
    def build(gen: torch.Generator, dtype: torch.dtype):
        x = randn(gen, (tokens, hidden * 2 if noncontig else hidden), dtype)
        if noncontig:
            x = x[:, ::2]  # a strided view, as a slice of a packed tensor would be
        args = {"x": x, "weight": 1 + 0.1 * randn(gen, (hidden,), dtype), "eps": 1e-6}
        if residual:
            args["residual"] = randn(gen, (tokens, hidden), dtype)
        return args

    return build


def rms_options(
    lead: tuple[int, ...],
    hidden: int,
    *,
    offset: float = 0.0,
    residual: bool = False,
    gate: str | None = None,
    gate_view: bool = False,
):
    """rms_norm on x [*lead, hidden] with the 1.2 options: ``offset`` (zero-centred weights drawn
    near 0, as trained), ``gate`` ("silu"/"sigmoid"; ``gate_view``: a slice of a packed projection)."""

    def build(gen: torch.Generator, dtype: torch.dtype):
        w = 0.1 * randn(gen, (hidden,), dtype) if offset else 1 + 0.1 * randn(gen, (hidden,), dtype)
        args = {"x": 2 * randn(gen, (*lead, hidden), dtype), "weight": w, "eps": 1e-6}
        if offset:
            args["weight_offset"] = offset
        if residual:
            args["residual"] = randn(gen, (*lead, hidden), dtype)
        if gate is not None:
            z = 2 * randn(gen, (*lead, 2 * hidden if gate_view else hidden), dtype)
            args.update(gate=z[..., hidden:] if gate_view else z, gate_act=gate)
        return args

    return build


def layer_norm(lead: tuple[int, ...], hidden: int, *, f32_params: bool = True, bias: bool = True, offset: float = 0.0):
    """layer_norm on x [*lead, hidden]: weight and bias float32 (DeepSeek's indexer k_norm) or of x's
    dtype (a Hugging Face checkpoint); ``offset``: a mean far from 0 (a one-pass variance cancels)."""

    def build(gen: torch.Generator, dtype: torch.dtype):
        pdt = torch.float32 if f32_params else dtype
        return {
            "x": (offset + 2 * randn(gen, (*lead, hidden), torch.float32)).to(dtype),
            "weight": 1 + 0.2 * randn(gen, (hidden,), pdt),
            "bias": 0.5 * randn(gen, (hidden,), pdt) if bias else None,
            "eps": 1e-6,
        }

    return build


def _cos_sin(positions: int, rot: int, base: float = 1e6) -> torch.Tensor:
    inv = 1.0 / base ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    angles = torch.arange(positions, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).float()


def rotary(tokens: int, hq: int, hkv: int, d: int, rot: int, neox: bool, max_pos: int = 4096):
    def build(gen: torch.Generator, dtype: torch.dtype):
        return {
            "positions": torch.randint(0, max_pos, (tokens,), generator=gen, dtype=torch.int64),
            "q": randn(gen, (tokens, hq, d), dtype),
            "k": randn(gen, (tokens, hkv, d), dtype),
            "cos_sin_cache": _cos_sin(max_pos, rot),
            "is_neox": neox,
        }

    return build


def silu(tokens: int, inter: int):
    return lambda gen, dtype: {"x": 2 * randn(gen, (tokens, 2 * inter), dtype)}
