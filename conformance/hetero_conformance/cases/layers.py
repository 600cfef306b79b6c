"""Cases of the glue ops: rms_norm (with and without the residual; zero-centred and gated, spec 1.2),
layer_norm (spec 1.3), rotary_embedding, silu_and_mul."""

from __future__ import annotations

from hetero.verify.case import Case
from hetero.verify.inputs import layers as draw
from hetero.verify.shapes import MODELS

__all__ = ["cases"]

FLOATS = ("float32", "float16", "bfloat16")

# Qwen3-Next-80B-A3B (transformers' Qwen3NextConfig defaults): hidden 2048; full attention 16 query,
# 2 KV heads of 256, partial rotary 0.25 (64 dims); Gated DeltaNet 32 value heads of V = 128.
QN_HIDDEN, QN_HEADS, QN_KV_HEADS, QN_HEAD_DIM, QN_ROT = 2048, 16, 2, 256, 64
QN_V_HEADS, QN_V = 32, 128


def _rms_option_cases(dt: str) -> list[Case]:
    """Qwen3-Next's zero-centred norms (hidden, per-head q/k), Gated DeltaNet's gated norm per value head."""
    quick = dt in ("float32", "bfloat16")
    st = {"dtype": dt, "hidden": QN_HIDDEN, "weight_offset": 1.0}
    gated = {"dtype": dt, "hidden": QN_V, "gate": True, "gate_act": "silu"}
    rows = [
        ("qwen3-next.t7.offset", draw.rms_options((7,), QN_HIDDEN, offset=1.0), st, quick),
        ("qwen3-next.t7.offset.residual", draw.rms_options((7,), QN_HIDDEN, offset=1.0, residual=True), st, False),
        (
            "qwen3-next.q-norm.t5.offset",
            draw.rms_options((5, QN_HEADS), QN_HEAD_DIM, offset=1.0),
            {**st, "hidden": QN_HEAD_DIM},
            False,
        ),
        (
            "qwen3-next.k-norm.t5.offset",
            draw.rms_options((5, QN_KV_HEADS), QN_HEAD_DIM, offset=1.0),
            {**st, "hidden": QN_HEAD_DIM},
            False,
        ),
        ("qwen3-next.gdn-gated.t6", draw.rms_options((6, QN_V_HEADS), QN_V, gate="silu"), gated, quick),
        (
            "qwen3-next.gdn-gated.t3.gate-view",
            draw.rms_options((3, QN_V_HEADS), QN_V, gate="silu", gate_view=True),
            gated,
            False,
        ),
        (
            "gated-sigmoid.t4.v128",
            draw.rms_options((4, QN_V_HEADS), QN_V, gate="sigmoid"),
            {**gated, "gate_act": "sigmoid"},
            False,
        ),
        ("qwen3-next.gdn-gated.t0", draw.rms_options((0, QN_V_HEADS), QN_V, gate="silu"), gated, False),
    ]
    return [Case("rms_norm", shape, dt, build, static, q) for shape, build, static, q in rows]


def _layer_norm_cases(dt: str) -> list[Case]:
    """The DSA indexer's k_norm (D = 128, eps 1e-6) and a wider norm."""
    quick = dt in ("float32", "bfloat16")
    rows = [
        ("deepseek-v3.2.k-norm.t9", draw.layer_norm((9,), 128), 128, True, True, quick),
        (
            "deepseek-v3.2.k-norm.t9.params-x-dtype",
            draw.layer_norm((9,), 128, f32_params=False),
            128,
            False,
            True,
            False,
        ),
        ("k-norm.t6.mean-offset", draw.layer_norm((6,), 128, offset=50.0), 128, True, True, dt == "float32"),
        ("h4096.t5.no-bias", draw.layer_norm((5,), 4096, bias=False), 4096, True, False, dt == "bfloat16"),
        ("h7168.t3.x-dtype-params", draw.layer_norm((3,), 7168, f32_params=False), 7168, False, True, False),
        ("per-head.t4.h8.d128", draw.layer_norm((4, 8), 128), 128, True, True, False),
        ("k-norm.t0", draw.layer_norm((0,), 128), 128, True, True, False),
    ]
    return [
        Case(
            "layer_norm",
            shape,
            dt,
            build,
            {"dtype": dt, "hidden": h, "weight_dtype": "float32" if f32 else dt, "bias": b},
            q,
        )
        for shape, build, h, f32, b, q in rows
    ]


def cases() -> list[Case]:
    out: list[Case] = []
    q8, ds = MODELS["qwen3-8b"], MODELS["deepseek-v3"]
    for dt in FLOATS:
        quick = dt in ("float32", "bfloat16")
        out += [
            Case(
                "rms_norm",
                "qwen3-8b.t7",
                dt,
                draw.rms(7, q8.hidden, False, False),
                {"dtype": dt, "hidden": q8.hidden},
                quick,
            ),
            Case(
                "rms_norm",
                "qwen3-8b.t7.residual",
                dt,
                draw.rms(7, q8.hidden, True, False),
                {"dtype": dt, "hidden": q8.hidden},
                quick,
            ),
            Case(
                "rms_norm",
                "qwen3-8b.qk-norm.t5",
                dt,
                draw.rms(5 * q8.heads, q8.head_dim, False, False),
                {"dtype": dt, "hidden": q8.head_dim},
            ),
            Case(
                "rms_norm",
                "deepseek-v3.t3.noncontig",
                dt,
                draw.rms(3, ds.hidden, True, True),
                {"dtype": dt, "hidden": ds.hidden},
            ),
            Case(
                "rms_norm", "qwen3-8b.t1", dt, draw.rms(1, q8.hidden, True, False), {"dtype": dt, "hidden": q8.hidden}
            ),
            Case(
                "rms_norm", "qwen3-8b.t0", dt, draw.rms(0, q8.hidden, True, False), {"dtype": dt, "hidden": q8.hidden}
            ),
            Case(
                "rotary_embedding",
                "qwen3-8b.neox.t9",
                dt,
                draw.rotary(9, q8.heads, q8.kv_heads, q8.head_dim, q8.head_dim, True),
                {"dtype": dt, "head_dim": q8.head_dim, "rotary_dim": q8.head_dim, "is_neox": True},
                quick,
            ),
            Case(
                "rotary_embedding",
                "deepseek-v3.interleaved.t6",
                dt,
                draw.rotary(6, ds.heads, 1, ds.qk_rope_head_dim, ds.qk_rope_head_dim, False),
                {"dtype": dt, "head_dim": ds.qk_rope_head_dim, "rotary_dim": ds.qk_rope_head_dim, "is_neox": False},
                quick,
            ),
            Case(
                "rotary_embedding",
                "partial-rotary.d128.rot64.t5",
                dt,
                draw.rotary(5, 8, 2, 128, 64, True),
                {"dtype": dt, "head_dim": 128, "rotary_dim": 64, "is_neox": True},
            ),
            Case(
                "rotary_embedding",
                "qwen3-next.partial-rotary.d256.rot64.t5",
                dt,
                draw.rotary(5, QN_HEADS, QN_KV_HEADS, QN_HEAD_DIM, QN_ROT, True),
                {"dtype": dt, "head_dim": QN_HEAD_DIM, "rotary_dim": QN_ROT, "is_neox": True},
                dt == "bfloat16",
            ),
            Case("silu_and_mul", "qwen3-8b.t7", dt, draw.silu(7, q8.intermediate), {"dtype": dt}, quick),
            Case(
                "silu_and_mul",
                "qwen3-30b-a3b.experts.t64",
                dt,
                draw.silu(64, MODELS["qwen3-30b-a3b"].moe_intermediate),
                {"dtype": dt},
            ),
            Case("silu_and_mul", "t0", dt, draw.silu(0, 256), {"dtype": dt}),
        ]
        out += _rms_option_cases(dt) + _layer_norm_cases(dt)
    return out
