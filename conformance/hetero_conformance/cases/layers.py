"""Cases of the glue ops: rms_norm (with and without the residual; zero-centred and gated, spec 1.2),
layer_norm (spec 1.3), rotary_embedding, silu_and_mul."""
from __future__ import annotations

import math

import torch

from hetero_conformance.case import Case
from hetero_conformance.cases._draw import randn
from hetero_conformance.shapes import MODELS

__all__ = ["cases"]

FLOATS = ("float32", "float16", "bfloat16")

# Qwen3-Next-80B-A3B (transformers' Qwen3NextConfig defaults): hidden 2048; full attention 16 query,
# 2 KV heads of 256, partial rotary 0.25 (64 dims); Gated DeltaNet 32 value heads of V = 128.
QN_HIDDEN, QN_HEADS, QN_KV_HEADS, QN_HEAD_DIM, QN_ROT = 2048, 16, 2, 256, 64
QN_V_HEADS, QN_V = 32, 128


def _rms(tokens: int, hidden: int, residual: bool, noncontig: bool):
    def build(gen: torch.Generator, dtype: torch.dtype):
        x = randn(gen, (tokens, hidden * 2 if noncontig else hidden), dtype)
        if noncontig:
            x = x[:, ::2]  # a strided view, as a slice of a packed tensor would be
        args = {"x": x, "weight": 1 + 0.1 * randn(gen, (hidden,), dtype), "eps": 1e-6}
        if residual:
            args["residual"] = randn(gen, (tokens, hidden), dtype)
        return args

    return build


def _rms_options(lead: tuple[int, ...], hidden: int, *, offset: float = 0.0, residual: bool = False,
                 gate: str | None = None, gate_view: bool = False):
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


def _rms_option_cases(dt: str) -> list[Case]:
    """Qwen3-Next's zero-centred norms (hidden, per-head q/k), Gated DeltaNet's gated norm per value head."""
    quick = dt in ("float32", "bfloat16")
    st = {"dtype": dt, "hidden": QN_HIDDEN, "weight_offset": 1.0}
    gated = {"dtype": dt, "hidden": QN_V, "gate": True, "gate_act": "silu"}
    rows = [
        ("qwen3-next.t7.offset", _rms_options((7,), QN_HIDDEN, offset=1.0), st, quick),
        ("qwen3-next.t7.offset.residual", _rms_options((7,), QN_HIDDEN, offset=1.0, residual=True), st, False),
        ("qwen3-next.q-norm.t5.offset", _rms_options((5, QN_HEADS), QN_HEAD_DIM, offset=1.0),
         {**st, "hidden": QN_HEAD_DIM}, False),
        ("qwen3-next.k-norm.t5.offset", _rms_options((5, QN_KV_HEADS), QN_HEAD_DIM, offset=1.0),
         {**st, "hidden": QN_HEAD_DIM}, False),
        ("qwen3-next.gdn-gated.t6", _rms_options((6, QN_V_HEADS), QN_V, gate="silu"), gated, quick),
        ("qwen3-next.gdn-gated.t3.gate-view", _rms_options((3, QN_V_HEADS), QN_V, gate="silu", gate_view=True),
         gated, False),
        ("gated-sigmoid.t4.v128", _rms_options((4, QN_V_HEADS), QN_V, gate="sigmoid"),
         {**gated, "gate_act": "sigmoid"}, False),
        ("qwen3-next.gdn-gated.t0", _rms_options((0, QN_V_HEADS), QN_V, gate="silu"), gated, False),
    ]
    return [Case("rms_norm", shape, dt, build, static, q) for shape, build, static, q in rows]


def _layer_norm(lead: tuple[int, ...], hidden: int, *, f32_params: bool = True, bias: bool = True, offset: float = 0.0):
    """layer_norm on x [*lead, hidden]: weight and bias float32 (DeepSeek's indexer k_norm) or of x's
    dtype (a Hugging Face checkpoint); ``offset``: a mean far from 0 (a one-pass variance cancels)."""

    def build(gen: torch.Generator, dtype: torch.dtype):
        pdt = torch.float32 if f32_params else dtype
        return {"x": (offset + 2 * randn(gen, (*lead, hidden), torch.float32)).to(dtype),
                "weight": 1 + 0.2 * randn(gen, (hidden,), pdt), "bias": 0.5 * randn(gen, (hidden,), pdt) if bias else None,
                "eps": 1e-6}

    return build


def _layer_norm_cases(dt: str) -> list[Case]:
    """The DSA indexer's k_norm (D = 128, eps 1e-6) and a wider norm."""
    quick = dt in ("float32", "bfloat16")
    rows = [
        ("deepseek-v3.2.k-norm.t9", _layer_norm((9,), 128), 128, True, True, quick),
        ("deepseek-v3.2.k-norm.t9.params-x-dtype", _layer_norm((9,), 128, f32_params=False), 128, False, True, False),
        ("k-norm.t6.mean-offset", _layer_norm((6,), 128, offset=50.0), 128, True, True, dt == "float32"),
        ("h4096.t5.no-bias", _layer_norm((5,), 4096, bias=False), 4096, True, False, dt == "bfloat16"),
        ("h7168.t3.x-dtype-params", _layer_norm((3,), 7168, f32_params=False), 7168, False, True, False),
        ("per-head.t4.h8.d128", _layer_norm((4, 8), 128), 128, True, True, False),
        ("k-norm.t0", _layer_norm((0,), 128), 128, True, True, False),
    ]
    return [Case("layer_norm", shape, dt, build, {"dtype": dt, "hidden": h, "weight_dtype": "float32" if f32 else dt,
                                                  "bias": b}, q)
            for shape, build, h, f32, b, q in rows]


def _cos_sin(positions: int, rot: int, base: float = 1e6) -> torch.Tensor:
    inv = 1.0 / base ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    angles = torch.arange(positions, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).float()


def _rotary(tokens: int, hq: int, hkv: int, d: int, rot: int, neox: bool, max_pos: int = 4096):
    def build(gen: torch.Generator, dtype: torch.dtype):
        return {
            "positions": torch.randint(0, max_pos, (tokens,), generator=gen, dtype=torch.int64),
            "q": randn(gen, (tokens, hq, d), dtype),
            "k": randn(gen, (tokens, hkv, d), dtype),
            "cos_sin_cache": _cos_sin(max_pos, rot),
            "is_neox": neox,
        }

    return build


def _silu(tokens: int, inter: int):
    return lambda gen, dtype: {"x": 2 * randn(gen, (tokens, 2 * inter), dtype)}


def cases() -> list[Case]:
    out: list[Case] = []
    q8, ds = MODELS["qwen3-8b"], MODELS["deepseek-v3"]
    for dt in FLOATS:
        quick = dt in ("float32", "bfloat16")
        out += [
            Case("rms_norm", "qwen3-8b.t7", dt, _rms(7, q8.hidden, False, False), {"dtype": dt, "hidden": q8.hidden}, quick),
            Case("rms_norm", "qwen3-8b.t7.residual", dt, _rms(7, q8.hidden, True, False), {"dtype": dt, "hidden": q8.hidden}, quick),
            Case("rms_norm", "qwen3-8b.qk-norm.t5", dt, _rms(5 * q8.heads, q8.head_dim, False, False), {"dtype": dt, "hidden": q8.head_dim}),
            Case("rms_norm", "deepseek-v3.t3.noncontig", dt, _rms(3, ds.hidden, True, True), {"dtype": dt, "hidden": ds.hidden}),
            Case("rms_norm", "qwen3-8b.t1", dt, _rms(1, q8.hidden, True, False), {"dtype": dt, "hidden": q8.hidden}),
            Case("rms_norm", "qwen3-8b.t0", dt, _rms(0, q8.hidden, True, False), {"dtype": dt, "hidden": q8.hidden}),
            Case("rotary_embedding", "qwen3-8b.neox.t9", dt, _rotary(9, q8.heads, q8.kv_heads, q8.head_dim, q8.head_dim, True),
                 {"dtype": dt, "head_dim": q8.head_dim, "rotary_dim": q8.head_dim, "is_neox": True}, quick),
            Case("rotary_embedding", "deepseek-v3.interleaved.t6", dt, _rotary(6, ds.heads, 1, ds.qk_rope_head_dim, ds.qk_rope_head_dim, False),
                 {"dtype": dt, "head_dim": ds.qk_rope_head_dim, "rotary_dim": ds.qk_rope_head_dim, "is_neox": False}, quick),
            Case("rotary_embedding", "partial-rotary.d128.rot64.t5", dt, _rotary(5, 8, 2, 128, 64, True),
                 {"dtype": dt, "head_dim": 128, "rotary_dim": 64, "is_neox": True}),
            Case("rotary_embedding", "qwen3-next.partial-rotary.d256.rot64.t5", dt,
                 _rotary(5, QN_HEADS, QN_KV_HEADS, QN_HEAD_DIM, QN_ROT, True),
                 {"dtype": dt, "head_dim": QN_HEAD_DIM, "rotary_dim": QN_ROT, "is_neox": True}, dt == "bfloat16"),
            Case("silu_and_mul", "qwen3-8b.t7", dt, _silu(7, q8.intermediate), {"dtype": dt}, quick),
            Case("silu_and_mul", "qwen3-30b-a3b.experts.t64", dt, _silu(64, MODELS["qwen3-30b-a3b"].moe_intermediate), {"dtype": dt}),
            Case("silu_and_mul", "t0", dt, _silu(0, 256), {"dtype": dt}),
        ]
        out += _rms_option_cases(dt) + _layer_norm_cases(dt)
    return out
