"""Cases of the GEMM family: gemm, scaled_gemm (fp8/int8 with per-tensor, per-row and
DeepSeek-V3 128-block scales) and grouped_gemm (MoE expert GEMMs with empty groups).

Shapes are real projections of Qwen3-8B, DeepSeek-V3 and Qwen3-30B-A3B. K, the
reduction length, stays the model's real size (it decides the accumulation
error); M is a handful of tokens and N is shrunk where the real projection is
too large for a CPU oracle (the shape name gives the N used).
"""

from __future__ import annotations

import torch

from hetero.verify.case import Case
from hetero.verify.inputs import gemm as draw
from hetero.verify.shapes import MODELS

__all__ = ["cases"]

FLOATS = ("float32", "float16", "bfloat16")
QUANTS = ("float8_e4m3fn", "float8_e4m3fnuz", "int8")


def _gemm_cases() -> list[Case]:
    q8, ds = MODELS["qwen3-8b"], MODELS["deepseek-v3"]
    h8, hd = q8.hidden, q8.head_dim
    qkv = (q8.heads + 2 * q8.kv_heads) * hd  # 6144
    out: list[Case] = []
    for dt in FLOATS:
        half = dt != "float32"

        def case(shape, build, n, k, quick=False, note="", **extra):
            static = {"dtype": dt, "n": n, "k": k, "bias": False, **extra}
            out.append(Case("gemm", shape, dt, build, static, quick, note))

        case(
            "qwen3-8b.qkv_proj.n1024.bias.t7",
            draw.gemm(7, 1024, h8, bias=True),
            1024,
            h8,
            quick=dt in ("float32", "bfloat16"),
            bias=True,
            note=f"QKV projection with a bias (Qwen2-style), N shrunk from {qkv}",
        )
        case("qwen3-8b.o_proj.n512.t1", draw.gemm(1, 512, q8.heads * hd), 512, q8.heads * hd, note="decode: one token")
        case(
            "qwen3-8b.down_proj.n256.t33",
            draw.gemm(33, 256, q8.intermediate),
            256,
            q8.intermediate,
            quick=dt == "float16",
            note="K = 12288: the longest real reduction; fp16 accumulation over it exceeds the fp16 bound",
        )
        case(
            "deepseek-v3.kv_a_proj.n576.t5",
            draw.gemm(5, ds.kv_lora_rank + ds.qk_rope_head_dim, ds.hidden),
            ds.kv_lora_rank + ds.qk_rope_head_dim,
            ds.hidden,
            note="real N = 576 (not a multiple of 128), K = 7168",
        )
        case(
            "qwen3-8b.gate_up.n512.rowstride.t9",
            draw.gemm(9, 512, h8, view="rows"),
            512,
            h8,
            note="a is a column slice of a wider buffer (row stride 4480)",
        )
        case(
            "qwen3-8b.o_proj.n256.colstride.t4",
            draw.gemm(4, 256, h8, view="cols"),
            256,
            h8,
            note="a is a strided view (every second column)",
        )
        case("qwen3-8b.qkv_proj.n256.t0", draw.gemm(0, 256, h8, bias=True), 256, h8, bias=True, note="no tokens")
        if half:
            e, gate_k = ds.experts, ds.hidden
            case(
                "deepseek-v3.router_gate.out_f32.t7",
                draw.gemm(7, e, gate_k, out_dtype=torch.float32),
                e,
                gate_k,
                quick=dt == "bfloat16",
                out_dtype="float32",
                note="the MoE router: half inputs, float32 logits out",
            )
            case(
                "qwen3-8b.qkv_proj.n512.bias.out_f32.t3",
                draw.gemm(3, 512, h8, bias=True, out_dtype=torch.float32),
                512,
                h8,
                bias=True,
                out_dtype="float32",
                note="bias in the input dtype, float32 output",
            )
    return out


def _scaled_cases() -> list[Case]:
    q8, ds = MODELS["qwen3-8b"], MODELS["deepseek-v3"]
    kv_a = ds.kv_lora_rank + ds.qk_rope_head_dim  # 576
    out: list[Case] = []
    for dt in QUANTS:
        quant = "int8" if dt == "int8" else "fp8"

        def case(shape, m, n, k, a_form, b_form, quick=False, note="", bias=None, out_dtype=None):
            static = {
                "dtype": dt,
                "quant": quant,
                "n": n,
                "k": k,
                "a_scale": a_form,
                "b_scale": b_form,
                "block_scale": "block" in (a_form, b_form),
                "bias": bias is not None,
                "out_dtype": str(out_dtype or torch.bfloat16).replace("torch.", ""),
            }
            build = draw.scaled(m, n, k, a_form, b_form, bias=bias, out_dtype=out_dtype)
            out.append(Case("scaled_gemm", shape, dt, build, static, quick, note))

        case(
            "deepseek-v3.kv_a_proj.block.n576.t7",
            7,
            kv_a,
            ds.hidden,
            "block",
            "block",
            quick=dt == "float8_e4m3fn",
            note="DeepSeek-V3 fp8: 1x128 activation and 128x128 weight scales; N = 576 ends in a partial block",
        )
        case(
            "deepseek-v3.q_a_proj.block.n384.t1",
            1,
            384,
            ds.hidden,
            "block",
            "block",
            quick=dt == "float8_e4m3fnuz",
            note="one token, block scales",
        )
        case(
            "edge.block.k1000.n300.t5",
            5,
            300,
            1000,
            "block",
            "block",
            note="K and N not multiples of 128: partial last blocks in both",
        )
        case(
            "qwen3-8b.qkv_proj.token-channel.n512.t9",
            9,
            512,
            q8.hidden,
            "row",
            "row",
            quick=dt == "int8",
            note="W8A8: per-token activation scales, per-output-channel weight scales",
        )
        case("qwen3-8b.o_proj.tensor.n512.t3", 3, 512, q8.hidden, "tensor", "tensor", note="per-tensor scales")
        case(
            "qwen3-8b.down_proj.token-block.bias.n256.t5",
            5,
            256,
            q8.intermediate,
            "row",
            "block",
            bias=torch.float32,
            note="mixed forms (per-token a, 128-block b), a float32 bias",
        )
        case(
            "deepseek-v3.kv_a_proj.block.bias.out_f32.n576.t3",
            3,
            kv_a,
            ds.hidden,
            "block",
            "block",
            bias=torch.float32,
            out_dtype=torch.float32,
            note="float32 output and bias",
        )
        case(
            "qwen3-8b.o_proj.tensor-channel.bias_bf16.n256.t4",
            4,
            256,
            q8.hidden,
            "tensor",
            "row",
            bias=torch.bfloat16,
            note="per-tensor a, per-channel b, a bias in the output dtype",
        )
        case("deepseek-v3.q_a_proj.block.n256.t0", 0, 256, ds.hidden, "block", "block", note="no tokens")
    return out


def _grouped_cases() -> list[Case]:
    qm, ds = MODELS["qwen3-30b-a3b"], MODELS["deepseek-v3"]
    out: list[Case] = []
    for dt in FLOATS:
        half = dt != "float32"

        def case(shape, groups, n, k, build, quick=False, note="", **extra):
            static = {"dtype": dt, "num_experts": groups, "n": n, "k": k, **extra}
            out.append(Case("grouped_gemm", shape, dt, build, static, quick, note))

        g = qm.experts // 8  # expert parallel over 8 ranks: 16 local experts
        case(
            f"qwen3-30b-a3b.gate_up.ep8.g{g}.n256.t5",
            g,
            256,
            qm.hidden,
            draw.grouped(5 * qm.top_k, g, 256, qm.hidden, tail=3, empty=(0, 1, 7, -1)),
            quick=dt in ("float32", "bfloat16"),
            note=(
                "16 local experts (EP 8 of 128); empty groups leading, middle and trailing; "
                "3 padding rows past the last group"
            ),
        )
        case(
            f"qwen3-30b-a3b.down.g{qm.experts}.n128.t16",
            qm.experts,
            128,
            qm.moe_intermediate,
            draw.grouped(16 * qm.top_k, qm.experts, 128, qm.moe_intermediate, empty=(0, 1, 64)),
            note="all 128 experts, K = moe_intermediate 768; the last group is not empty and ends exactly at M",
        )
        case(
            "deepseek-v3.gate_up.ep8.g32.n64.t7",
            ds.experts // 8,
            64,
            ds.hidden,
            draw.grouped(
                7 * ds.top_k,
                ds.experts // 8,
                64,
                ds.hidden,
                tail=9,
                empty=(0, 13, 14, -2, -1),
                out_dtype=torch.float32 if half else None,
            ),
            quick=dt == "bfloat16",
            out_dtype="float32" if half else dt,
            note=(
                "K = 7168, 32 local experts (EP 8 of 256), rows past the last group; half inputs give a float32 output"
            ),
        )
        case(
            f"deepseek-v3.down.g{ds.experts}.n32.t4",
            ds.experts,
            32,
            ds.moe_intermediate,
            draw.grouped(4 * ds.top_k, ds.experts, 32, ds.moe_intermediate, empty=(0,)),
            note="all 256 experts, K = moe_intermediate 2048, most groups empty",
        )
        case(
            "qwen3-30b-a3b.one-group.g8.n128.t24",
            8,
            128,
            qm.hidden,
            draw.grouped(24, 8, 128, qm.hidden, only=3),
            note="every row in one middle group",
        )
        case(
            "qwen3-30b-a3b.one-group-last.g8.n128.t6",
            8,
            128,
            qm.hidden,
            draw.grouped(6, 8, 128, qm.hidden, only=7),
            note="every row in the last group, which ends exactly at M",
        )
        case("qwen3-30b-a3b.g8.n128.t1", 8, 128, qm.hidden, draw.grouped(1, 8, 128, qm.hidden, only=5), note="one row")
        case("qwen3-30b-a3b.g8.n128.t0", 8, 128, qm.hidden, draw.grouped(0, 8, 128, qm.hidden), note="no rows")
    return out


def cases() -> list[Case]:
    return _gemm_cases() + _scaled_cases() + _grouped_cases()
