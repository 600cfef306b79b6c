"""Cases of route's spec 1.8 options: DeepSeek-V4's ``scoring="sqrtsoftplus"`` and hash routing (``fixed_ids``).

Routing is DeepSeek-V4's (transformers' ``DeepseekV4TopKRouter`` / ``DeepseekV4HashRouter``): scores
``sqrt(softplus(logits))``, a correction bias that only selects, renormalized weights times 1.5; top-6
of 256 experts (V4-Flash) and of 384 (V4-Pro, whose scaling factor is taken as Flash's here). Its first
layers are hash-routed: each token's experts are a row of a frozen table (``tid2eid[token]``, distinct
experts per row), only weighted by the scores; the cases draw ids that are never the top-k by score.
Logits are drawn as in ``moe`` (every selection clears a margin); 37 tokens, one, none, and logits up to
~40, where softplus is linear and its square root must still be taken.
"""

from __future__ import annotations

from hetero.verify.case import Case
from hetero.verify.inputs import moe as draw

__all__ = ["cases", "V4_FLASH_EXPERTS", "V4_PRO_EXPERTS", "V4_TOP_K", "V4_FACTOR"]

FLOATS = ("float32", "float16", "bfloat16")
V4_FLASH_EXPERTS, V4_PRO_EXPERTS, V4_TOP_K, V4_FACTOR = 256, 384, 6, 1.5


def _cases(dt: str) -> list[Case]:
    f32, bf16 = dt == "float32", dt == "bfloat16"
    soft = dict(scoring="sqrtsoftplus", factor=V4_FACTOR)
    rows = [
        # (shape, experts, tokens, builder options, quick, note)
        ("deepseek-v4-flash.t37", V4_FLASH_EXPERTS, 37, dict(bias="small"), f32, "small correction bias"),
        ("deepseek-v4-flash.bias-decides.t37", V4_FLASH_EXPERTS, 37, dict(bias="large"), bf16, "the bias decides"),
        ("deepseek-v4-pro.t37", V4_PRO_EXPERTS, 37, dict(bias="small"), bf16, "384 experts"),
        ("deepseek-v4-flash.t1", V4_FLASH_EXPERTS, 1, dict(bias="small"), False, "one token"),
        (
            "deepseek-v4-flash.large-logits.t9",
            V4_FLASH_EXPERTS,
            9,
            dict(bias="small", sigma=(8.0, 11.0), shift=(-4.0, 4.0)),
            False,
            "logits up to ~40: softplus is linear there, its square root still taken",
        ),
        ("deepseek-v4-flash.no-bias.t5", V4_FLASH_EXPERTS, 5, {}, False, "sqrtsoftplus without a bias"),
        ("deepseek-v4-flash.hash.t37", V4_FLASH_EXPERTS, 37, dict(fixed=True), f32 or bf16, "fixed_ids = tid2eid[tok]"),
        ("deepseek-v4-pro.hash.t37", V4_PRO_EXPERTS, 37, dict(fixed=True), False, "fixed_ids, 384 experts"),
        ("deepseek-v4-flash.hash.t1", V4_FLASH_EXPERTS, 1, dict(fixed=True), False, "fixed_ids, one token"),
        ("deepseek-v4-flash.hash.t0", V4_FLASH_EXPERTS, 0, dict(fixed=True), False, "fixed_ids, no tokens"),
        (
            "deepseek-v4-flash.hash.not-renormalized.t7",
            V4_FLASH_EXPERTS,
            7,
            dict(fixed=True, renormalize=False),
            False,
            "fixed_ids, raw scores times the factor",
        ),
    ]
    out = []
    for shape, experts, m, opts, quick, note in rows:
        static = {
            "dtype": dt,
            "num_experts": experts,
            "top_k": V4_TOP_K,
            "scoring": "sqrtsoftplus",
            "n_group": 1,
            "topk_group": 1,
            "renormalize": opts.get("renormalize", True),
            "correction_bias": "bias" in opts,
        }
        if opts.get("fixed"):
            static["fixed_ids"] = True  # only then: an implementation without the option is asked for it alone
        build = draw.route(m, experts, V4_TOP_K, **soft, **opts)
        out.append(Case("route", shape, dt, build, static, quick, note))
    return out


def cases() -> list[Case]:
    return [c for dt in FLOATS for c in _cases(dt)]
