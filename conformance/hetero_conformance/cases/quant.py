"""Cases of quantize_activation (spec 1.4), every output bit for bit.

Named by the input dtype (the case dtype), with the quantized dtype in their shape: DeepSeek-V3's
1x128 fp8 groups (K 7168, the 576-wide kv_a_proj output with a partial last group of 64), ue8m0
scales (DeepSeek-V3.1+), AMD's e4m3fnuz (qmax 224), Qwen3 W8A8 per-token int8, compressed-tensors'
asymmetric int8, and edges: no rows, an all-zero row, exact rounding ties, huge and tiny magnitudes.
The scaled_grouped_gemm cases of the same spec section are in ``scaled_grouped_gemm``.
"""

from __future__ import annotations

from hetero.verify.case import Case, dtype_name
from hetero.verify.inputs import quant as draw
from hetero.verify.shapes import MODELS

__all__ = ["cases"]

_SHORT = {draw.FP8: "fp8", draw.FNUZ: "fnuz", draw.INT8: "int8"}


def cases() -> list[Case]:
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
