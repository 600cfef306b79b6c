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

import math

import torch

from hetero_conformance.case import Case
from hetero_conformance.cases._draw import randn
from hetero_conformance.cases._fused_moe import expert_ids, expert_pool, fused_cases, quant_cases, routing_weights
from hetero_conformance.shapes import MODELS

__all__ = ["cases"]

FLOATS = ("float32", "float16", "bfloat16")

#: Relative gap required at each routing decision. A float32 router is off by
#: ~1e-6 of a score (softmax over 256 experts, sigmoid plus bias); 1e-3 is 1000x that.
MARGIN = 1e-3
_TRIES = 200


# ---------------------------------------------------------------- route

def _spaced_logits(gen: torch.Generator, m: int, e: int, sigma: tuple[float, float], shift: tuple[float, float]) -> torch.Tensor:
    """float32 [m, e]: per token, the e normal quantiles (so the values are spread like router
    logits, yet well apart) jittered by under a quarter of their smallest gap, scaled by a random
    sigma, shifted, in a random order."""
    base = torch.special.ndtri((torch.arange(e, dtype=torch.float64) + 0.5) / e)
    gap = float(base.diff().min())
    jitter = (torch.rand(m, e, generator=gen, dtype=torch.float64) - 0.5) * 0.45 * gap
    s = sigma[0] + (sigma[1] - sigma[0]) * torch.rand(m, 1, generator=gen, dtype=torch.float64)
    c = shift[0] + (shift[1] - shift[0]) * torch.rand(m, 1, generator=gen, dtype=torch.float64)
    vals = (base + jitter) * s + c
    order = torch.rand(m, e, generator=gen).argsort(dim=1)
    return vals.gather(1, order).float()


def _select(logits: torch.Tensor, *, top_k: int, scoring: str, n_group: int, topk_group: int,
            bias: torch.Tensor | None, group_top2: bool | None = None, fill: float = float("-inf")) -> tuple[torch.Tensor, torch.Tensor]:
    """The experts route picks, in float64 (sorted per token), and per token whether every
    decision on the way cleared MARGIN. ``group_top2`` (default: bias given) and ``fill``
    (the value of dropped experts) let the builders check that a variant picks differently."""
    scores = logits.double().softmax(dim=-1) if scoring == "softmax" else logits.double().sigmoid()
    sel, mag = scores, scores.abs()  # mag: the size a float32 router's rounding error scales with
    if bias is not None:
        sel, mag = scores + bias.double(), mag + bias.double().abs()
    rows, experts = sel.shape
    ok = torch.ones(rows, dtype=torch.bool)
    if n_group > 1:
        grouped, gmag = sel.reshape(rows, n_group, -1), mag.reshape(rows, n_group, -1)
        top2 = bias is not None if group_top2 is None else group_top2
        gscore = grouped.topk(2, dim=-1).values.sum(-1) if top2 else grouped.amax(dim=-1)
        gscale = 2 * gmag.amax(dim=-1)
        order = gscore.argsort(dim=-1, descending=True)
        if topk_group < n_group:
            last, first_out = order[:, topk_group - 1 : topk_group], order[:, topk_group : topk_group + 1]
            gap = (gscore.gather(1, last) - gscore.gather(1, first_out)).squeeze(1)
            ok &= gap > MARGIN * torch.maximum(gscale.gather(1, last), gscale.gather(1, first_out)).squeeze(1)
        keep = torch.zeros(rows, n_group, dtype=torch.bool).scatter_(1, order[:, :topk_group], True)
        keep = keep.repeat_interleave(experts // n_group, dim=1)
        sel = sel.masked_fill(~keep, fill)
        mag = mag.masked_fill(~keep, abs(fill) if math.isfinite(fill) else 0.0)
    order = sel.argsort(dim=-1, descending=True, stable=True)
    if top_k < experts:
        last, first_out = order[:, top_k - 1 : top_k], order[:, top_k : top_k + 1]
        gap = (sel.gather(1, last) - sel.gather(1, first_out)).squeeze(1)
        ok &= gap > MARGIN * torch.maximum(mag.gather(1, last), mag.gather(1, first_out)).squeeze(1)
    return order[:, :top_k].sort(dim=1).values, ok


def _route(m: int, e: int, top_k: int, *, scoring: str = "softmax", renormalize: bool = True, n_group: int = 1,
           topk_group: int = 1, bias: str | None = None, factor: float = 1.0, sigma=(1.0, 2.5), shift=(0.0, 0.0)):
    """route's inputs: logits drawn per token until every routing decision clears MARGIN in the case dtype.

    bias: None, "small" (|b| < 0.05: moves few choices), "large" (|b| < 0.5: the selection
    must differ from the unbiased one for most tokens) or "negative" (most experts biased
    below -1, so scores plus bias are negative in whole groups, and an implementation that
    masks dropped groups with 0.0 instead of -inf must pick differently).
    """

    def draw_bias(gen: torch.Generator) -> torch.Tensor | None:
        if bias is None:
            return None
        if bias == "small":
            return (torch.rand(e, generator=gen) - 0.5) * 0.1
        if bias == "large":
            return (torch.rand(e, generator=gen) - 0.5) * 1.0
        per = e // n_group
        b = -1.2 - 0.6 * torch.rand(e, generator=gen)  # scores + bias in (-1.8, -0.2)
        lifted = torch.randint(0, per, (n_group,), generator=gen) + torch.arange(n_group) * per
        b[lifted[2:]] = 0.2 * torch.rand(n_group - 2, generator=gen)  # one positive expert in all but two groups
        return b

    def build(gen: torch.Generator, dtype: torch.dtype):
        b = draw_bias(gen)
        sel = dict(top_k=top_k, scoring=scoring, n_group=n_group, topk_group=topk_group)
        logits = _spaced_logits(gen, m, e, sigma, shift).to(dtype)
        for _ in range(_TRIES):
            _, ok = _select(logits, bias=b, **sel)
            if bool(ok.all()):
                break
            bad = (~ok).nonzero().squeeze(1)
            logits[bad] = _spaced_logits(gen, len(bad), e, sigma, shift).to(dtype)
        else:
            raise RuntimeError(f"route case: no tie-free logits after {_TRIES} draws")
        if m and bias in ("large", "negative"):
            ids = _select(logits, bias=b, **sel)[0]
            zero = _select(logits, bias=torch.zeros(e), **sel)[0]  # the bias ignored
            differ = int((ids != zero).any(dim=1).sum())
            if bias == "negative":
                differ = min(differ, int((ids != _select(logits, bias=b, fill=0.0, **sel)[0]).any(dim=1).sum()))
            if 2 * differ < m:
                raise RuntimeError(f"route case: the {bias} bias decides only {differ} of {m} tokens")
        args = {"router_logits": logits, "top_k": top_k, "scoring": scoring, "renormalize": renormalize,
                "n_group": n_group, "topk_group": topk_group, "routed_scaling_factor": factor}
        if b is not None:
            args["correction_bias"] = b
        return args

    return build


def _route_cases() -> list[Case]:
    qm, q235, ds, v2l = (MODELS[n] for n in ("qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "deepseek-v2-lite"))
    out: list[Case] = []
    for dt in FLOATS:
        quick = dt in ("float32", "bfloat16")

        def case(shape, model_e, k, build, quick=False, note="", **extra):
            static = {"dtype": dt, "num_experts": model_e, "top_k": k, "scoring": "softmax", "n_group": 1,
                      "topk_group": 1, "renormalize": True, "correction_bias": False, **extra}
            out.append(Case("route", shape, dt, build, static, quick, note))

        case("qwen3-30b-a3b.t7", qm.experts, qm.top_k, _route(7, qm.experts, qm.top_k), quick,
             note="softmax top-8 of 128, renormalized (norm_topk_prob)")
        case("qwen3-235b-a22b.t1", q235.experts, q235.top_k, _route(1, q235.experts, q235.top_k), note="one token")
        case("qwen3-30b-a3b.large-logits.t5", qm.experts, qm.top_k, _route(5, qm.experts, qm.top_k, sigma=(8.0, 11.0), shift=(-4.0, 4.0)),
             note="logits up to ~40: softmax must subtract the max")
        case("qwen3-30b-a3b.t0", qm.experts, qm.top_k, _route(0, qm.experts, qm.top_k), note="no tokens")
        ds_static = dict(scoring="sigmoid", n_group=ds.n_group, topk_group=ds.topk_group, correction_bias=True)
        ds_kw = dict(scoring="sigmoid", n_group=ds.n_group, topk_group=ds.topk_group, factor=2.5, shift=(-1.5, 0.5))
        case("deepseek-v3.t9", ds.experts, ds.top_k, _route(9, ds.experts, ds.top_k, bias="small", **ds_kw), **ds_static,
             note="sigmoid, 8 groups keep 4 by top-2 sums, small correction bias, factor 2.5")
        case("deepseek-v3.bias-decides.t8", ds.experts, ds.top_k, _route(8, ds.experts, ds.top_k, bias="large", **ds_kw), quick,
             **ds_static, note="a correction bias large enough to change the selection of most tokens")
        case("deepseek-v3.negative-groups.t6", ds.experts, ds.top_k, _route(6, ds.experts, ds.top_k, bias="negative", **ds_kw),
             dt == "bfloat16", **ds_static, note="scores + bias negative in whole groups: dropped groups must be -inf, not 0.0")
        case("deepseek-v2-lite.t7", v2l.experts, v2l.top_k, _route(7, v2l.experts, v2l.top_k, renormalize=False), dt == "float32",
             renormalize=False, note="softmax top-6 of 64, not renormalized")
        case("deepseek-v2.grouped.t5", 160, 6, _route(5, 160, 6, n_group=8, topk_group=3, renormalize=False, factor=16.0),
             n_group=8, topk_group=3, renormalize=False,
             note="DeepSeek-V2: 160 experts, 8 groups keep 3 by their max score, factor 16, not renormalized")
    return out


# ---------------------------------------------------------------- permute / unpermute

def _permute(m: int, e: int, k: int, h: int, unused: tuple[int, ...], hot: int = 0):
    """hot > 0: every token picks among ``hot`` experts only (long runs of one expert: stability matters)."""

    def build(gen: torch.Generator, dtype: torch.dtype):
        pool = expert_pool(e, unused)
        if hot:
            pool = pool[torch.randperm(len(pool), generator=gen)[:hot]].sort().values
        return {"x": randn(gen, (m, h), dtype), "ids": expert_ids(gen, m, k, pool), "num_experts": e}

    return build


def _unpermute(m: int, e: int, k: int, h: int, scoring: str = "softmax", factor: float = 1.0):
    def build(gen: torch.Generator, dtype: torch.dtype):
        ids = expert_ids(gen, m, k, expert_pool(e, (0, -1)))
        perm = torch.sort(ids.reshape(-1).long(), stable=True).indices
        return {"y_sorted": randn(gen, (m * k, h), dtype), "perm": perm, "weights": routing_weights(gen, m, k, scoring, factor)}

    return build


def _data_cases() -> list[Case]:
    qm, ds, v2l = MODELS["qwen3-30b-a3b"], MODELS["deepseek-v3"], MODELS["deepseek-v2-lite"]
    out: list[Case] = []
    for dt in FLOATS:
        quick = dt in ("float32", "bfloat16")

        def case(op, shape, e, k, h, build, quick=False, note="", **extra):
            static = {"dtype": dt, "num_experts": e, "top_k": k, "hidden": h, **extra}
            out.append(Case(op, shape, dt, build, static, quick, note))

        # moe_permute
        case("moe_permute", "qwen3-30b-a3b.t16", qm.experts, qm.top_k, qm.hidden,
             _permute(16, qm.experts, qm.top_k, qm.hidden, (0, 1, 50, 51, 52, -1)), quick,
             note="experts 0, 1, 50-52 and 127 get no tokens (leading, middle, trailing empty groups)")
        case("moe_permute", "deepseek-v3.t5", ds.experts, ds.top_k, ds.hidden,
             _permute(5, ds.experts, ds.top_k, ds.hidden, (0, -2, -1)), note="40 pairs over 256 experts: most groups empty")
        case("moe_permute", "deepseek-v2-lite.hot.t24", v2l.experts, v2l.top_k, v2l.hidden,
             _permute(24, v2l.experts, v2l.top_k, v2l.hidden, (), hot=9), note="every token among the same 9 experts: long runs")
        case("moe_permute", "qwen3-30b-a3b.t1", qm.experts, qm.top_k, qm.hidden,
             _permute(1, qm.experts, qm.top_k, qm.hidden, (0, -1)), note="one token")
        case("moe_permute", "qwen3-30b-a3b.t0", qm.experts, qm.top_k, qm.hidden,
             _permute(0, qm.experts, qm.top_k, qm.hidden, ()), note="no tokens: every group empty")
        # moe_unpermute
        case("moe_unpermute", "qwen3-30b-a3b.t16", qm.experts, qm.top_k, qm.hidden,
             _unpermute(16, qm.experts, qm.top_k, qm.hidden), quick, note="renormalized softmax weights")
        case("moe_unpermute", "deepseek-v3.t5", ds.experts, ds.top_k, ds.hidden,
             _unpermute(5, ds.experts, ds.top_k, ds.hidden, "sigmoid", 2.5), note="renormalized sigmoid weights times 2.5")
        case("moe_unpermute", "deepseek-v2-lite.t1", v2l.experts, v2l.top_k, v2l.hidden,
             _unpermute(1, v2l.experts, v2l.top_k, v2l.hidden), note="one token")
        case("moe_unpermute", "qwen3-30b-a3b.t0", qm.experts, qm.top_k, qm.hidden,
             _unpermute(0, qm.experts, qm.top_k, qm.hidden), note="no tokens")
    return out


def cases() -> list[Case]:
    quantized = [c for dt in ("bfloat16", "float16") for c in quant_cases(dt)]  # float32: see quant_cases
    return _route_cases() + _data_cases() + [c for dt in FLOATS for c in fused_cases(dt)] + quantized
