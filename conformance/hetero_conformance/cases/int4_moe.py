"""fused_moe on packed int4 experts (spec 1.9, W4A16) at Kimi-K2, Qwen3-30B-A3B and GLM-4.5-Air shapes.

The hidden size H (the first GEMM's reduction, in groups) and top-8 stay real; the expert count is
cut (the shape name gives it) and moe_intermediate I is a tensor-parallel slice or shrunk, so that a
CPU oracle dequantizes every expert a token uses in both GEMMs. Where I is not a multiple of the
group, the second GEMM's last group is partial; one edge case has odd H and odd I (a random padding
nibble in every row of both weights). Activation silu (all three models).
"""

from __future__ import annotations

from hetero.verify.case import Case
from hetero.verify.inputs import int4 as draw
from hetero.verify.shapes import MODELS
from hetero_conformance.cases.int4 import GLM_45_AIR, GROUP, KIMI_K2

__all__ = ["cases"]


def _cases(dt: str) -> list[Case]:
    qm, kimi, glm = MODELS["qwen3-30b-a3b"], KIMI_K2, GLM_45_AIR
    out: list[Case] = []

    def case(shape, m, e, k, h, inter, g, unused=(0, -1), quick=False, note="", zp=False, bias=False, dtypes=()):
        if dt not in dtypes:
            return
        static = {
            "dtype": dt,
            "num_experts": e,
            "top_k": k,
            "hidden": h,
            "intermediate": inter,
            "activation": "silu",
            "weight_dtype": "int4",
            "group_size": g,
            "w13_zero_point": zp,
            "w2_zero_point": zp,
            **({"w13_bias": True, "w2_bias": True} if bias else {}),
        }
        build = draw.fused(m, e, k, h, inter, g, unused, zero_point=zp, bias=bias)
        out.append(Case("fused_moe", shape, dt, build, static, quick, note))

    case(
        "kimi-k2.w4a16-g32.e8.i48.t4",
        4,
        8,
        kimi["top_k"],
        kimi["hidden"],
        48,
        kimi["group"],
        unused=(),
        quick=dt == "float32",
        dtypes=("float32", "bfloat16"),
        note=f"Kimi-K2 / K2.5 (pack-quantized, symmetric): H = 7168 in 224 groups of 32, top-8; experts cut "
        f"from 384 to 8, I from {kimi['inter']} to 48 (1.5 groups)",
    )
    case(
        "qwen3-30b-a3b.w4a16-g128.tp8.e16.i96.t6",
        6,
        16,
        qm.top_k,
        qm.hidden,
        qm.moe_intermediate // 8,
        GROUP,
        dtypes=("float16", "bfloat16"),
        note="Qwen3-30B-A3B GPTQ-Int4 at TP 8: I = 96, one partial group in the second GEMM; 16 of 128 experts",
    )
    case(
        "glm-4.5-air.w4a16-g128-zp.tp16.e9.i88.t5",
        5,
        9,
        glm["top_k"],
        glm["hidden"],
        glm["inter"] // 16,
        GROUP,
        unused=(4,),
        quick=dt == "bfloat16",
        zp=True,
        dtypes=("float32", "bfloat16"),
        note="GLM-4.5-Air AWQ (asymmetric) at TP 16: H = 4096 in 32 groups, I = 88; 9 of 128 experts, one empty",
    )
    case(
        "edge.odd-h-i.h1001.i45.w4a16-g32-zp.e8.t5",
        5,
        8,
        4,
        1001,
        45,
        32,
        unused=(2,),
        zp=True,
        dtypes=("float32", "float16", "bfloat16"),
        note="odd H and I: a random padding nibble ends every row of both weights; partial groups in both",
    )
    case(
        "qwen3-30b-a3b.w4a16-g128.e16.i32.t1",
        1,
        16,
        qm.top_k,
        qm.hidden,
        32,
        GROUP,
        unused=(),
        dtypes=("bfloat16",),
        note="decode: one token, 8 of 16 experts empty",
    )
    case(
        "qwen3-30b-a3b.w4a16-g128.bias.e8.i64.t3",
        3,
        8,
        qm.top_k,
        qm.hidden,
        64,
        GROUP,
        unused=(),
        bias=True,
        dtypes=("float16", "bfloat16"),
        note="both expert biases (no W4A16 release has them; the spec allows them): every expert used",
    )
    case(
        "qwen3-30b-a3b.w4a16-g128.e8.i32.t0",
        0,
        8,
        qm.top_k,
        qm.hidden,
        32,
        GROUP,
        unused=(),
        dtypes=("bfloat16",),
        note="no tokens",
    )
    return out


def cases() -> list[Case]:
    """fused_moe's packed int4 cases (each in the dtypes it names)."""
    return [c for dt in ("float32", "float16", "bfloat16") for c in _cases(dt)]
