"""fused_moe's cases (their inputs, and the expert ids and routing weights the MoE data cases share, are
drawn by ``hetero.verify.inputs.fused_moe``).

Qwen3 / DeepSeek (silu), gpt-oss-20b and -120b (swigluoai, alpha 1.702, limit 7, expert
biases on both projections; transformers' GptOssExperts after the gate/up columns are
de-interleaved) and DeepSeek-V4 (swiglu_clamp, limit 10; the defaults of transformers'
DeepseekV4Config: 256 experts, top-6, H = 4096). Expert weights are scaled like trained
ones (std 1/sqrt(fan-in)); the intermediate size is shrunk so that 128-256 experts fit a
CPU oracle, the hidden size and the expert counts stay real (one gpt-oss case keeps the real
I = 2880 and four experts instead). The clamped cases scale w13 by ``gain`` so that gate/up
values spread past +-limit: a builder whose draw leaves too few of them beyond the limit
raises, so every such case tests its clamp.
"""

from __future__ import annotations

import torch

from hetero.verify.case import Case
from hetero.verify.inputs import fused_moe as draw
from hetero.verify.shapes import MODELS

__all__ = ["fused_cases", "quant_cases"]

FLOATS = ("float32", "float16", "bfloat16")
#: gpt-oss-120b (not in shapes.MODELS: its attention is gpt-oss-20b's): 128 experts, top-4, H = I = 2880.
GPT_OSS_120B_EXPERTS = 128
#: DeepSeek-V4 (transformers' DeepseekV4Config defaults): 256 experts, top-6, H 4096, moe_intermediate 2048.
V4_EXPERTS, V4_TOP_K, V4_HIDDEN, V4_INTER = 256, 6, 4096, 2048


def quant_cases(dt: str) -> list[Case]:
    """fused_moe's quantized cases of one (activation) dtype: fp8 DeepSeek-V3 / Qwen3-FP8 with 1x128 activation
    groups and 128x128 weight blocks, W8A8 int8 per token and channel, and weight-only W8A16."""
    qm, ds = MODELS["qwen3-30b-a3b"], MODELS["deepseek-v3"]
    out: list[Case] = []

    def case(shape, m, e, inter, qdtype, form, act_quant, quick=False, note="", model=qm, unused=(0, -1), **opt):
        static = {
            "dtype": dt,
            "num_experts": e,
            "top_k": model.top_k,
            "hidden": model.hidden,
            "intermediate": inter,
            "activation": "silu",
            "weight_dtype": str(qdtype).replace("torch.", ""),
            "w13_scale": form,
            "w2_scale": form,
            "act_quant": act_quant,
            "act_scale_fmt": opt.get("fmt", "float"),
            **({"w13_bias": True, "w2_bias": True} if opt.get("bias") else {}),
        }
        build = draw.fused_quant(m, e, model.top_k, model.hidden, inter, unused, qdtype, form, act_quant, **opt)
        out.append(Case("fused_moe", shape, dt, build, static, quick, note))

    fp8, fnuz, i8 = torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.int8
    case(
        "deepseek-v3.fp8.group128.e12.i128.t3",
        3,
        12,
        128,
        fp8,
        "block",
        "group128",
        dt == "bfloat16",
        model=ds,
        note="DeepSeek-V3 fp8: 1x128 activation groups, 128x128 weight blocks, H = 7168, top-8; "
        f"12 of 256 experts, I {ds.moe_intermediate} -> 128",
    )
    case(
        "deepseek-v3.1.fp8.group128-ue8m0.e12.i256.t4",
        4,
        12,
        256,
        fp8,
        "block",
        "group128",
        model=ds,
        fmt="ue8m0",
        note="DeepSeek-V3.1: ue8m0 (power of two) activation scales",
    )
    case(
        "qwen3-30b-a3b-fp8.tp4.group128.e16.i192.t6",
        6,
        16,
        qm.moe_intermediate // 4,
        fp8,
        "block",
        "group128",
        note="Qwen3-30B-A3B-FP8 at TP 4: I = 192, partial 128-blocks in both GEMMs",
    )
    case(
        "qwen3-30b-a3b.fnuz.group128.e16.i192.t5",
        5,
        16,
        192,
        fnuz,
        "block",
        "group128",
        note="AMD MI300 e4m3fnuz (qmax 224)",
    )
    case(
        "qwen3-30b-a3b.w8a8-int8.token.e32.i128.t6",
        6,
        32,
        128,
        i8,
        "row",
        "token",
        dt == "bfloat16",
        note="W8A8 int8: per-token activations, per-channel weights",
    )
    case(
        "qwen3-30b-a3b.w8a16-fp8.channel.e32.i128.t5",
        5,
        32,
        128,
        fp8,
        "row",
        None,
        dt == "bfloat16",
        note="weight-only fp8 (W8A16): x times the dequantized weights",
    )
    case(
        "qwen3-30b-a3b.w8a16-int8.expert.e16.i192.t4",
        4,
        16,
        192,
        i8,
        "group",
        None,
        note="weight-only int8 with one scale per expert",
    )
    case(
        "qwen3-30b-a3b.fp8.group128.bias.e16.i192.t4",
        4,
        16,
        192,
        fp8,
        "block",
        "group128",
        bias=True,
        note="quantized GEMMs with both expert biases",
    )
    case("qwen3-30b-a3b.fp8.group128.e16.i192.t0", 0, 16, 192, fp8, "block", "group128", note="no tokens")
    return out


def _gpt_oss(dt: str, case) -> None:
    oss = MODELS["gpt-oss-20b"]
    e20, k, h, real_i = oss.experts, oss.top_k, oss.hidden, oss.moe_intermediate
    both = dict(act="swigluoai", bias=True)
    case(
        "gpt-oss-20b.swigluoai.bias.i32.t5",
        5,
        e20,
        k,
        h,
        32,
        (0, -1),
        dt in ("float32", "bfloat16"),
        **both,
        note=f"32 experts top-4, H = 2880, I shrunk from {real_i} to 32, alpha 1.702, limit 7, "
        "both biases; empty experts",
    )
    case("gpt-oss-20b.swigluoai.i32.t7", 7, e20, k, h, 32, (), act="swigluoai", note="swigluoai without biases")
    case("gpt-oss-20b.swigluoai.bias.i32.t1", 1, e20, k, h, 32, (), **both, note="one token (decode)")
    case("gpt-oss-20b.swigluoai.bias.i32.t0", 0, e20, k, h, 32, (), **both, note="no tokens")
    case(
        "gpt-oss-20b.swigluoai-alpha1.bias.i32.t5",
        5,
        e20,
        k,
        h,
        32,
        (),
        act="swigluoai-alpha1",
        bias=True,
        note="alpha 1.0 instead of gpt-oss's 1.702: an implementation that fixes alpha fails here",
    )
    if dt == "bfloat16":  # the released models' compute dtype; these weights are the costliest inputs here
        case(
            "gpt-oss-120b.swigluoai.bias.i16.t6",
            6,
            GPT_OSS_120B_EXPERTS,
            k,
            h,
            16,
            (0, 77, -1),
            **both,
            note=f"128 experts top-4, H = 2880, I shrunk from {real_i} to 16, both biases",
        )
        case(
            "gpt-oss-20b.swigluoai.bias.i2880.e4.t3",
            3,
            4,
            k,
            h,
            real_i,
            (),
            **both,
            note="the real H = I = 2880 (long K in both GEMMs), experts cut to 4: every token uses all four",
        )


def _deepseek_v4(dt: str, case) -> None:
    clamp = dict(act="swiglu_clamp")
    case(
        "deepseek-v4.e32.swiglu-clamp.i32.t6",
        6,
        32,
        V4_TOP_K,
        V4_HIDDEN,
        32,
        (0, -1),
        dt in ("float32", "bfloat16"),
        **clamp,
        note="silu(min(gate, 10)) * clamp(up, +-10), H = 4096, top-6; "
        f"experts cut from 256 to 32, I from {V4_INTER} to 32",
    )
    if dt == "bfloat16":
        case(
            "deepseek-v4.swiglu-clamp.i16.t5",
            5,
            V4_EXPERTS,
            V4_TOP_K,
            V4_HIDDEN,
            16,
            (0, -1),
            **clamp,
            note=f"256 experts top-6, H = 4096, I shrunk from {V4_INTER} to 16",
        )


def fused_cases(dt: str) -> list[Case]:
    """The fused_moe cases of one dtype."""
    qm, ds, v2l = MODELS["qwen3-30b-a3b"], MODELS["deepseek-v3"], MODELS["deepseek-v2-lite"]
    out: list[Case] = []

    def case(shape, m, e, k, h, inter, unused, quick=False, note="", act="silu", bias=False, **route):
        static = {"dtype": dt, "num_experts": e, "top_k": k, "hidden": h, "intermediate": inter, **draw.ACTS[act][0]}
        if bias:
            static.update(w13_bias=True, w2_bias=True)
        out.append(
            Case("fused_moe", shape, dt, draw.fused(m, e, k, h, inter, unused, act, bias, **route), static, quick, note)
        )

    case(
        "qwen3-30b-a3b.i16.t5",
        5,
        qm.experts,
        qm.top_k,
        qm.hidden,
        16,
        (0, 64, -1),
        dt in ("float32", "bfloat16"),
        note=f"128 experts, H = 2048, moe_intermediate shrunk from {qm.moe_intermediate} to 16; empty experts",
    )
    case(
        "qwen3-30b-a3b.i32.t12",
        12,
        qm.experts,
        qm.top_k,
        qm.hidden,
        32,
        (0, -1),
        note=f"96 pairs over 126 experts, moe_intermediate shrunk from {qm.moe_intermediate} to 32",
    )
    case(
        "deepseek-v2-lite.i32.t1",
        1,
        v2l.experts,
        v2l.top_k,
        v2l.hidden,
        32,
        (),
        note="one token: 58 of 64 experts empty",
    )
    case("qwen3-30b-a3b.i16.t0", 0, qm.experts, qm.top_k, qm.hidden, 16, (), note="no tokens")
    if dt == "bfloat16":  # DeepSeek-V3's own dtype; its 256 x 7168 expert weights are the costliest inputs here
        case(
            "deepseek-v3.i16.t5",
            5,
            ds.experts,
            ds.top_k,
            ds.hidden,
            16,
            (0, -1),
            scoring="sigmoid",
            factor=2.5,
            note=f"256 experts, H = 7168, moe_intermediate shrunk from {ds.moe_intermediate} to 16; weights times 2.5",
        )
    _gpt_oss(dt, case)
    _deepseek_v4(dt, case)
    return out
