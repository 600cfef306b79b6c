"""Cases of scaled_grouped_gemm (spec 1.4), against float64 on the dequantized operands.

Named by the quantized dtype: the MoE experts of DeepSeek-V3 (K and N real where the CPU oracle
allows, experts and tokens scaled down) and Qwen3-30B-A3B-FP8 at TP 4 (I = 192: partial
128-blocks), W8A8 int8 with and without zero points, per-tensor scales, empty groups and rows past
the last group.
"""

from __future__ import annotations

import torch

from hetero.verify.case import Case, dtype_name
from hetero.verify.inputs import quant as draw
from hetero.verify.shapes import MODELS

__all__ = ["cases"]


def cases() -> list[Case]:
    ds, qm = MODELS["deepseek-v3"], MODELS["qwen3-30b-a3b"]
    h, di = ds.hidden, ds.moe_intermediate
    qi = qm.moe_intermediate // 4  # Qwen3-30B-A3B-FP8 at TP 4: I = 192, 1.5 blocks of 128
    out: list[Case] = []
    for dt in ("float8_e4m3fn", "float8_e4m3fnuz", "int8"):
        fn, i8 = dt == "float8_e4m3fn", dt == "int8"

        def case(shape, rows, groups, n, k, a_form, b_form, quick=False, note="", **opt):
            static = {
                "dtype": dt,
                "num_experts": groups,
                "n": n,
                "k": k,
                "a_scale": a_form,
                "b_scale": b_form,
                "a_zero_point": opt.get("zp", False),
                "out_dtype": dtype_name(opt.get("out_dtype") or torch.bfloat16),
            }
            out.append(
                Case(
                    "scaled_grouped_gemm",
                    shape,
                    dt,
                    draw.grouped(rows, groups, n, k, a_form, b_form, **opt),
                    static,
                    quick,
                    note,
                )
            )

        case(
            f"deepseek-v3.gate_up.block.g8.n448.k{h}.t24",
            24,
            8,
            448,
            h,
            "block",
            "block",
            quick=not i8,
            empty=(2,),
            note="1x128 / 128x128 scales, K = 7168 real, N shrunk from 4096 to 448 (a partial last N block), "
            "8 of 256 experts",
        )
        case(
            f"deepseek-v3.down.block.g8.n576.k{di}.t16",
            16,
            8,
            576,
            di,
            "block",
            "block",
            tail=5,
            empty=(0, -1),
            note="K = moe_intermediate 2048 real, N shrunk from 7168 to 576; rows past the last group; empty experts",
        )
        case(
            f"qwen3-30b-a3b-fp8.tp4.down.block.g16.n512.k{qi}.t20",
            20,
            16,
            512,
            qi,
            "block",
            "block",
            quick=fn,
            empty=(0, 7, -1),
            note="TP 4: K = I/4 = 192 ends in a partial 64-column block; empty groups first, middle, last",
        )
        case(
            f"qwen3-30b-a3b-fp8.tp4.gate_up.block.g16.n{2 * qi}.k{qm.hidden}.t20",
            20,
            16,
            2 * qi,
            qm.hidden,
            "block",
            "block",
            note="TP 4: N = 2I/4 = 384 (3 blocks), K = 2048",
        )
        case(
            f"qwen3-30b-a3b.token-channel.g16.n256.k{qm.hidden}.t12",
            12,
            16,
            256,
            qm.hidden,
            "row",
            "row",
            quick=i8,
            tail=3,
            note="W8A8: per-token a_scale, per-channel b_scale; rows past the last group",
        )
        case(
            "edge.block.k1000.n300.g4.t9",
            9,
            4,
            300,
            1000,
            "block",
            "block",
            quick=dt == "float8_e4m3fnuz",
            note="K and N not multiples of 128: partial last blocks in both",
        )
        case(
            f"qwen3-30b-a3b.tensor-group.g8.n256.k{qm.hidden}.t10",
            10,
            8,
            256,
            qm.hidden,
            "tensor",
            "group",
            note="per-tensor a_scale, one b_scale per expert",
        )
        case(
            f"qwen3-30b-a3b.token-block.g8.n192.k{qi}.t7",
            7,
            8,
            192,
            qi,
            "row",
            "block",
            out_dtype=torch.float32,
            note="mixed forms (per-token a, 128-block b) with partial blocks; float32 output",
        )
        case("deepseek-v3.block.g8.n256.t0", 0, 8, 256, h, "block", "block", note="no rows")
        case(
            "qwen3-30b-a3b.token-channel.g8.n128.all-empty.t0-tail4",
            0,
            8,
            128,
            qm.hidden,
            "row",
            "row",
            tail=4,
            note="every group empty, 4 rows past the last group: all zero",
        )
        if i8:
            case(
                f"qwen3-30b-a3b.asym-zp.token-channel.g16.n256.k{qm.hidden}.t12",
                12,
                16,
                256,
                qm.hidden,
                "row",
                "row",
                quick=True,
                zp=True,
                empty=(1,),
                note="asymmetric int8 activations: per-token a_zero_point",
            )
            case(
                "asym-zp.token-block.g4.n300.k1000.t9",
                9,
                4,
                300,
                1000,
                "row",
                "block",
                zp=True,
                tail=2,
                out_dtype=torch.float16,
                note="zero points with 128-block weight scales, partial blocks, float16 output",
            )
    return out
