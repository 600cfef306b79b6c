"""Cases of the quantized ops of spec 1.4: quantize_activation (every output bit for bit) and
scaled_grouped_gemm (against float64 on the dequantized operands).

quantize_activation cases are named by the input dtype (the case dtype) and carry the quantized
dtype in their shape: DeepSeek-V3's 1x128 fp8 groups (K 7168, the 576-wide kv_a_proj output with a
partial last group of 64), ue8m0 scales (DeepSeek-V3.1+), AMD's e4m3fnuz (qmax 224), Qwen3 W8A8
per-token int8, compressed-tensors' asymmetric int8, and edges: no rows, an all-zero row, exact
rounding ties, huge and tiny magnitudes. scaled_grouped_gemm cases are named by the quantized
dtype: the MoE experts of DeepSeek-V3 (K and N real where the CPU oracle allows, experts and tokens
scaled down) and Qwen3-30B-A3B-FP8 at TP 4 (I = 192: partial 128-blocks), W8A8 int8 with and
without zero points, per-tensor scales, empty groups and rows past the last group.
"""

from __future__ import annotations

import torch

from hetero.verify.case import Case, dtype_name
from hetero.verify.inputs import quant as draw
from hetero.verify.shapes import MODELS

__all__ = ["cases"]

_SHORT = {draw.FP8: "fp8", draw.FNUZ: "fnuz", draw.INT8: "int8"}


def _quantize_cases() -> list[Case]:
    ds, q8, qm = MODELS["deepseek-v3"], MODELS["qwen3-8b"], MODELS["qwen3-30b-a3b"]
    kv_a = ds.kv_lora_rank + ds.qk_rope_head_dim  # 576 = 4.5 groups of 128
    out: list[Case] = []

    def case(dt, shape, m, k, qdtype, group, quick=False, note="", **opt):
        static = {
            "dtype": dt,
            "quant_dtype": dtype_name(qdtype),
            "k": k,
            "group_size": group,
            "scale_fmt": opt.get("fmt", "float"),
            "asymmetric": opt.get("asym", False),
        }
        name = f"{shape}.{_SHORT[qdtype]}"
        out.append(
            Case("quantize_activation", name, dt, draw.quantize(m, k, qdtype, group, **opt), static, quick, note)
        )

    for dt in ("bfloat16", "float16", "float32"):
        bf = dt == "bfloat16"
        case(
            dt,
            f"deepseek-v3.hidden.g128.k{ds.hidden}.t7",
            7,
            ds.hidden,
            draw.FP8,
            128,
            quick=bf,
            note="DeepSeek-V3 fp8: 1x128 groups of the hidden state (56 groups)",
        )
        case(
            dt,
            f"deepseek-v3.kv_a.g128.k{kv_a}.t5",
            5,
            kv_a,
            draw.FP8,
            128,
            quick=dt == "float16",
            note="K = 576: 5 groups, the last one partial (64 columns)",
        )
        case(
            dt,
            f"qwen3-8b.token.k{q8.hidden}.t9",
            9,
            q8.hidden,
            draw.INT8,
            None,
            quick=bf,
            note="W8A8 per-token int8 (one group per row)",
        )
        case(
            dt,
            "edge.zero-row.g128.k576.t4",
            4,
            kv_a,
            draw.FP8,
            128,
            quick=dt == "float32",
            edge="zero_row",
            note="an all-zero row: the amax floor 1e-10 makes its scale 1e-10/448 and its values 0",
        )
    for dt in ("bfloat16", "float32"):
        bf = dt == "bfloat16"
        case(
            dt,
            f"deepseek-v3.hidden.ue8m0.g128.k{ds.hidden}.t6",
            6,
            ds.hidden,
            draw.FP8,
            128,
            quick=bf,
            fmt="ue8m0",
            note="DeepSeek-V3.1+ ue8m0 scales: the smallest power of two >= amax / 448",
        )
        case(
            dt,
            f"deepseek-v3.hidden.g128.k{ds.hidden}.t5",
            5,
            ds.hidden,
            draw.FNUZ,
            128,
            quick=bf,
            note="AMD MI300 e4m3fnuz: qmax 224 (not 240)",
        )
        case(
            dt,
            f"qwen3-30b-a3b.asym.token.k{qm.hidden}.t6",
            6,
            qm.hidden,
            draw.INT8,
            None,
            quick=bf,
            asym=True,
            note="compressed-tensors asymmetric int8 per token: scale and zero point",
        )
        case(
            dt,
            "asym.g128.k576.t5",
            5,
            kv_a,
            draw.INT8,
            128,
            asym=True,
            edge="constant",
            note="asymmetric int8 per 1x128 group, a constant row (hi == lo: the range floor)",
        )
        case(
            dt,
            "edge.ties.g128.k576.t6",
            6,
            kv_a,
            draw.FP8,
            128,
            quick=bf,
            edge="ties",
            note="every x / s exactly halfway between two e4m3 values: ties to even",
        )
        case(
            dt,
            "edge.ties.token.k512.t6",
            6,
            512,
            draw.INT8,
            None,
            quick=bf,
            edge="ties",
            note="every x / s exactly n + 0.5: int8 ties to even (torch.round), not half away from zero",
        )
        case(
            dt,
            "edge.ties.ue8m0.g128.k384.t3",
            3,
            384,
            draw.FNUZ,
            128,
            edge="ties",
            fmt="ue8m0",
            note="ties with e4m3fnuz and ue8m0 scales",
        )
        case(
            dt,
            "edge.huge-tiny.g128.k576.t4",
            4,
            kv_a,
            draw.FP8,
            128,
            quick=dt == "float32",
            edge="huge",
            note="a row of magnitude 1e30 (1e4 in fp16) and one of 1e-12, below the amax floor",
        )
        case(
            dt,
            "edge.huge-tiny.ue8m0.token.k576.t4",
            4,
            kv_a,
            draw.INT8,
            None,
            edge="huge",
            fmt="ue8m0",
            note="huge and tiny rows with power-of-two scales, int8",
        )
        case(
            dt,
            "view.g64.k512.t5",
            5,
            512,
            draw.FP8,
            64,
            view=True,
            note="group size 64; x a column slice (row stride 576)",
        )
        case(dt, "g128.k7168.t0", 0, ds.hidden, draw.FP8, 128, quick=bf, note="no rows")
        case(dt, "asym.g100.k300.t0", 0, 300, draw.INT8, 100, asym=True, note="no rows, asymmetric")
    return out


def _grouped_cases() -> list[Case]:
    ds, qm = MODELS["deepseek-v3"], MODELS["qwen3-30b-a3b"]
    h, di = ds.hidden, ds.moe_intermediate
    qi = qm.moe_intermediate // 4  # Qwen3-30B-A3B-draw.FP8 at TP 4: I = 192, 1.5 blocks of 128
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
            note="1x128 / 128x128 scales, K = 7168 real, N shrunk from 4096 to 448 (a partial last N block), 8 of 256 experts",
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


def cases() -> list[Case]:
    return _quantize_cases() + _grouped_cases()
