"""Cases of the MoE family: route, moe_permute, moe_unpermute and fused_moe.

Routing configurations are the real ones of Qwen3-30B-A3B / Qwen3-235B-A22B
(softmax, top-8 of 128, renormalized), DeepSeek-V3 (sigmoid, 256 experts,
8 groups keep 4, correction bias, factor 2.5), DeepSeek-V2 (softmax, 160
experts, 8 groups keep 3, factor 16, not renormalized) and DeepSeek-V2-Lite
(softmax, top-6 of 64, not renormalized).

route's ids are compared as sets, so every case's logits are drawn with every
decision the router makes (which groups stay, which experts make the top-k)
separated by a margin far above float32 rounding, checked in float64 on the
logits as rounded to the case dtype; a token whose draw misses the margin is
drawn again. fused_moe's cases (silu, gpt-oss's swigluoai with expert biases,
DeepSeek-V4's swiglu_clamp) are in ``_fused_moe``.
"""

from __future__ import annotations

from hetero.verify.case import Case
from hetero.verify.inputs import moe as draw
from hetero.verify.shapes import MODELS
from hetero_conformance.cases._fused_moe import fused_cases, quant_cases

__all__ = ["cases"]

FLOATS = ("float32", "float16", "bfloat16")


def _route_cases() -> list[Case]:
    qm, q235, ds, v2l = (MODELS[n] for n in ("qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "deepseek-v2-lite"))
    out: list[Case] = []
    for dt in FLOATS:
        quick = dt in ("float32", "bfloat16")

        def case(shape, model_e, k, build, quick=False, note="", **extra):
            static = {
                "dtype": dt,
                "num_experts": model_e,
                "top_k": k,
                "scoring": "softmax",
                "n_group": 1,
                "topk_group": 1,
                "renormalize": True,
                "correction_bias": False,
                **extra,
            }
            out.append(Case("route", shape, dt, build, static, quick, note))

        case(
            "qwen3-30b-a3b.t7",
            qm.experts,
            qm.top_k,
            draw.route(7, qm.experts, qm.top_k),
            quick,
            note="softmax top-8 of 128, renormalized (norm_topk_prob)",
        )
        case("qwen3-235b-a22b.t1", q235.experts, q235.top_k, draw.route(1, q235.experts, q235.top_k), note="one token")
        case(
            "qwen3-30b-a3b.large-logits.t5",
            qm.experts,
            qm.top_k,
            draw.route(5, qm.experts, qm.top_k, sigma=(8.0, 11.0), shift=(-4.0, 4.0)),
            note="logits up to ~40: softmax must subtract the max",
        )
        case("qwen3-30b-a3b.t0", qm.experts, qm.top_k, draw.route(0, qm.experts, qm.top_k), note="no tokens")
        ds_static = dict(scoring="sigmoid", n_group=ds.n_group, topk_group=ds.topk_group, correction_bias=True)
        ds_kw = dict(scoring="sigmoid", n_group=ds.n_group, topk_group=ds.topk_group, factor=2.5, shift=(-1.5, 0.5))
        case(
            "deepseek-v3.t9",
            ds.experts,
            ds.top_k,
            draw.route(9, ds.experts, ds.top_k, bias="small", **ds_kw),
            **ds_static,
            note="sigmoid, 8 groups keep 4 by top-2 sums, small correction bias, factor 2.5",
        )
        case(
            "deepseek-v3.bias-decides.t8",
            ds.experts,
            ds.top_k,
            draw.route(8, ds.experts, ds.top_k, bias="large", **ds_kw),
            quick,
            **ds_static,
            note="a correction bias large enough to change the selection of most tokens",
        )
        case(
            "deepseek-v3.negative-groups.t6",
            ds.experts,
            ds.top_k,
            draw.route(6, ds.experts, ds.top_k, bias="negative", **ds_kw),
            dt == "bfloat16",
            **ds_static,
            note="scores + bias negative in whole groups: dropped groups must be -inf, not 0.0",
        )
        case(
            "deepseek-v2-lite.t7",
            v2l.experts,
            v2l.top_k,
            draw.route(7, v2l.experts, v2l.top_k, renormalize=False),
            dt == "float32",
            renormalize=False,
            note="softmax top-6 of 64, not renormalized",
        )
        case(
            "deepseek-v2.grouped.t5",
            160,
            6,
            draw.route(5, 160, 6, n_group=8, topk_group=3, renormalize=False, factor=16.0),
            n_group=8,
            topk_group=3,
            renormalize=False,
            note="DeepSeek-V2: 160 experts, 8 groups keep 3 by their max score, factor 16, not renormalized",
        )
    return out


def _data_cases() -> list[Case]:
    qm, ds, v2l = MODELS["qwen3-30b-a3b"], MODELS["deepseek-v3"], MODELS["deepseek-v2-lite"]
    out: list[Case] = []
    for dt in FLOATS:
        quick = dt in ("float32", "bfloat16")

        def case(op, shape, e, k, h, build, quick=False, note="", **extra):
            static = {"dtype": dt, "num_experts": e, "top_k": k, "hidden": h, **extra}
            out.append(Case(op, shape, dt, build, static, quick, note))

        # moe_permute
        case(
            "moe_permute",
            "qwen3-30b-a3b.t16",
            qm.experts,
            qm.top_k,
            qm.hidden,
            draw.permute(16, qm.experts, qm.top_k, qm.hidden, (0, 1, 50, 51, 52, -1)),
            quick,
            note="experts 0, 1, 50-52 and 127 get no tokens (leading, middle, trailing empty groups)",
        )
        case(
            "moe_permute",
            "deepseek-v3.t5",
            ds.experts,
            ds.top_k,
            ds.hidden,
            draw.permute(5, ds.experts, ds.top_k, ds.hidden, (0, -2, -1)),
            note="40 pairs over 256 experts: most groups empty",
        )
        case(
            "moe_permute",
            "deepseek-v2-lite.hot.t24",
            v2l.experts,
            v2l.top_k,
            v2l.hidden,
            draw.permute(24, v2l.experts, v2l.top_k, v2l.hidden, (), hot=9),
            note="every token among the same 9 experts: long runs",
        )
        case(
            "moe_permute",
            "qwen3-30b-a3b.t1",
            qm.experts,
            qm.top_k,
            qm.hidden,
            draw.permute(1, qm.experts, qm.top_k, qm.hidden, (0, -1)),
            note="one token",
        )
        case(
            "moe_permute",
            "qwen3-30b-a3b.t0",
            qm.experts,
            qm.top_k,
            qm.hidden,
            draw.permute(0, qm.experts, qm.top_k, qm.hidden, ()),
            note="no tokens: every group empty",
        )
        # moe_unpermute
        case(
            "moe_unpermute",
            "qwen3-30b-a3b.t16",
            qm.experts,
            qm.top_k,
            qm.hidden,
            draw.unpermute(16, qm.experts, qm.top_k, qm.hidden),
            quick,
            note="renormalized softmax weights",
        )
        case(
            "moe_unpermute",
            "deepseek-v3.t5",
            ds.experts,
            ds.top_k,
            ds.hidden,
            draw.unpermute(5, ds.experts, ds.top_k, ds.hidden, "sigmoid", 2.5),
            note="renormalized sigmoid weights times 2.5",
        )
        case(
            "moe_unpermute",
            "deepseek-v2-lite.t1",
            v2l.experts,
            v2l.top_k,
            v2l.hidden,
            draw.unpermute(1, v2l.experts, v2l.top_k, v2l.hidden),
            note="one token",
        )
        case(
            "moe_unpermute",
            "qwen3-30b-a3b.t0",
            qm.experts,
            qm.top_k,
            qm.hidden,
            draw.unpermute(0, qm.experts, qm.top_k, qm.hidden),
            note="no tokens",
        )
    return out


def cases() -> list[Case]:
    quantized = [c for dt in ("bfloat16", "float16") for c in quant_cases(dt)]  # float32: see quant_cases
    return _route_cases() + _data_cases() + [c for dt in FLOATS for c in fused_cases(dt)] + quantized
