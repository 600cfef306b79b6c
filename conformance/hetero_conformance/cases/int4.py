"""Packed int4 weights (spec 1.9, W4A16): gemm and grouped_gemm cases (fused_moe's are ``int4_moe``).

Shapes of the three W4A16 releases private clouds serve: Kimi-K2 / K2.5 (hidden 7168, 384 experts
top-8 of moe_intermediate 2048, group 32, symmetric: compressed-tensors ``pack-quantized``),
Qwen3-30B-A3B (hidden 2048, 128 experts top-8 of 768, group 128, symmetric: GPTQ-Int4) and GLM-4.5-Air
(hidden 4096, 96 query heads and 8 KV heads of 128, dense intermediate 10944, 128 experts top-8 of
1408, group 128, asymmetric: AWQ). K, the reduction and the scale-group axis, keeps the real size
(partial last groups where the real K is not a multiple of the group: GLM's 10944 = 85.5 x 128, and
the tensor-parallel slices of moe_intermediate); N is shrunk (the shape name gives the N used) and M
is a handful of tokens. Edge cases: odd K (a padding nibble the spec ignores, drawn random), a group
wider than K, no tokens, empty groups, rows past the last group. float32 cases hold the bit-exact
dequantization to float32's tolerance (a kernel that rounds the weights to bf16 fails there).
"""

from __future__ import annotations

import torch

from hetero.verify.case import Case
from hetero.verify.inputs import int4 as draw
from hetero.verify.shapes import MODELS

__all__ = ["cases", "KIMI_K2", "GLM_45_AIR"]

FLOATS = ("float32", "float16", "bfloat16")
#: Kimi-K2 / K2.5's text model (DeepSeek-V3's): hidden, experts, top-k, moe_intermediate, int4 group
KIMI_K2 = dict(hidden=7168, experts=384, top_k=8, inter=2048, group=32)
#: GLM-4.5-Air: hidden, heads, KV heads, head_dim, dense intermediate, experts, top-k, moe_intermediate, group
GLM_45_AIR = dict(hidden=4096, heads=96, kv_heads=8, head_dim=128, dense=10944, experts=128, top_k=8, inter=1408)
GROUP = 128  # GPTQ's and AWQ's usual group (Qwen3-30B-A3B-GPTQ-Int4, GLM-4.5-Air AWQ)


def _gemm_cases() -> list[Case]:
    qm, glm = MODELS["qwen3-30b-a3b"], GLM_45_AIR
    q_n = qm.heads * qm.head_dim  # 4096
    out: list[Case] = []
    for dt in FLOATS:

        def case(shape, m, n, k, g, quick=False, note="", zp=False, dtypes=FLOATS, **opt):
            if dt not in dtypes:
                return
            static = {
                "dtype": dt,
                "weight_dtype": "int4",
                "group_size": g,
                "b_zero_point": zp,
                "n": n,
                "k": k,
                "bias": bool(opt.get("bias")),
            }
            if opt.get("out_dtype") is not None:
                static["out_dtype"] = str(opt["out_dtype"]).replace("torch.", "")
            out.append(Case("gemm", shape, dt, draw.gemm(m, n, k, g, zero_point=zp, **opt), static, quick, note))

        case(
            "qwen3-30b-a3b.q_proj.w4a16-g128.n128.t7",
            7,
            128,
            qm.hidden,
            GROUP,
            quick=dt == "float32",
            note=f"GPTQ-Int4, symmetric (zero point 8), K = 2048 in 16 groups; N shrunk from {q_n}",
        )
        case(
            "glm-4.5-air.down_proj.w4a16-g128-zp.n64.t5",
            5,
            64,
            glm["dense"],
            GROUP,
            zp=True,
            note="AWQ, asymmetric; the dense layer's K = 10944 = 85.5 groups: the last group is partial",
        )
        case(
            "glm-4.5-air.qkv_proj.w4a16-g128-zp.bias.n128.t6",
            6,
            128,
            glm["hidden"],
            GROUP,
            zp=True,
            bias=True,
            dtypes=("float16", "bfloat16"),
            note="GLM's qkv bias in a's dtype; N shrunk from 14336",
        )
        case(
            "glm-4.5-air.o_proj.w4a16-g128-zp.n64.t1",
            1,
            64,
            glm["heads"] * glm["head_dim"],
            GROUP,
            zp=True,
            dtypes=("float32", "bfloat16"),
            note="decode: one token; K = 12288",
        )
        case(
            "edge.odd-k.k1001.w4a16-g32-zp.n64.t4",
            4,
            64,
            1001,
            32,
            quick=dt == "bfloat16",
            zp=True,
            note="odd K: each row's last byte holds one code and a random high nibble to ignore; 31 groups + 9",
        )
        case("edge.group-over-k.k100.w4a16-g128.n64.t3", 3, 64, 100, GROUP, note="one partial group wider than K")
        case("qwen3-30b-a3b.q_proj.w4a16-g128.n128.t0", 0, 128, qm.hidden, GROUP, note="no tokens")
        case(
            "qwen3-30b-a3b.o_proj.w4a16-g128.bias_f32.out_f32.n64.t5",
            5,
            64,
            q_n,
            GROUP,
            bias=True,
            bias_dtype=torch.float32,
            out_dtype=torch.float32,
            dtypes=("float16", "bfloat16"),
            note="half activations, a float32 bias and a float32 output",
        )
    return out


def _grouped_cases() -> list[Case]:
    qm, kimi, glm = MODELS["qwen3-30b-a3b"], KIMI_K2, GLM_45_AIR
    out: list[Case] = []
    for dt in FLOATS:

        def case(shape, groups, n, k, g, build, quick=False, note="", zp=False, dtypes=FLOATS, **extra):
            if dt not in dtypes:
                return
            static = {
                "dtype": dt,
                "weight_dtype": "int4",
                "group_size": g,
                "b_zero_point": zp,
                "num_experts": groups,
                "n": n,
                "k": k,
                **extra,
            }
            out.append(Case("grouped_gemm", shape, dt, build, static, quick, note))

        local = kimi["experts"] // 48  # 8 local experts at EP 48
        case(
            f"kimi-k2.gate_up.ep48.g{local}.w4a16-g32.n64.t5",
            local,
            64,
            kimi["hidden"],
            kimi["group"],
            draw.grouped(5 * kimi["top_k"], local, 64, kimi["hidden"], 32, tail=3, empty=(0, 3, -1)),
            quick=dt == "bfloat16",
            dtypes=("float32", "bfloat16"),
            note=f"Kimi-K2 at EP 48 (8 of 384 experts), K = 7168 in 224 groups of 32; empty groups leading, "
            f"middle and trailing; 3 rows past the last group; N shrunk from {2 * kimi['inter']}",
        )
        case(
            f"kimi-k2.down.ep48.g{local}.w4a16-g32.n64.t3",
            local,
            64,
            kimi["inter"],
            kimi["group"],
            draw.grouped(3 * kimi["top_k"], local, 64, kimi["inter"], 32, empty=(0,)),
            dtypes=("float16", "bfloat16"),
            note="the real down projection K = moe_intermediate 2048 in 64 groups; N shrunk from 7168",
        )
        tp4 = qm.moe_intermediate // 4  # 192: 1.5 groups of 128
        case(
            "qwen3-30b-a3b.down.tp4.g16.w4a16-g128.n128.t6",
            16,
            128,
            tp4,
            GROUP,
            draw.grouped(6 * qm.top_k, 16, 128, tp4, GROUP, empty=(3, 4)),
            note="Qwen3-30B-A3B at TP 4: K = 768 / 4 = 192, a partial second group",
        )
        tp8 = glm["inter"] // 8  # 176
        case(
            "glm-4.5-air.down.tp8.g16.w4a16-g128-zp.n128.t5",
            16,
            128,
            tp8,
            GROUP,
            draw.grouped(5 * glm["top_k"], 16, 128, tp8, GROUP, zero_point=True, tail=2, empty=(0, -1)),
            quick=dt == "float32",
            zp=True,
            note="GLM-4.5-Air at TP 8, asymmetric: K = 1408 / 8 = 176 (1.375 groups); rows past the last group",
        )
        case(
            "glm-4.5-air.gate_up.g4.w4a16-g128-zp.n64.t6",
            4,
            64,
            glm["hidden"],
            GROUP,
            draw.grouped(6, 4, 64, glm["hidden"], GROUP, zero_point=True, only=3),
            zp=True,
            dtypes=("float32", "bfloat16"),
            note="every row in the last group, which ends exactly at M",
        )
        case(
            "edge.odd-k.k77.g4.w4a16-g32-zp.n32.t9",
            4,
            32,
            77,
            32,
            draw.grouped(9, 4, 32, 77, 32, zero_point=True, empty=(1,)),
            zp=True,
            note="odd K with a random padding nibble; a partial third group",
        )
        case(
            "qwen3-30b-a3b.gate_up.g8.w4a16-g128.out_f32.n64.t5",
            8,
            64,
            qm.hidden,
            GROUP,
            draw.grouped(5, 8, 64, qm.hidden, GROUP, out_dtype=torch.float32),
            out_dtype="float32",
            dtypes=("float16", "bfloat16"),
            note="half activations, float32 output",
        )
        case(
            "qwen3-30b-a3b.g8.w4a16-g128.n64.t0",
            8,
            64,
            qm.hidden,
            GROUP,
            draw.grouped(0, 8, 64, qm.hidden, GROUP),
            dtypes=("bfloat16",),
            note="no rows",
        )
    return out


def cases() -> list[Case]:
    """The gemm and grouped_gemm cases on packed int4 weights."""
    return _gemm_cases() + _grouped_cases()
