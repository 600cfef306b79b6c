"""Inputs of the MoE data cases: route (logits with a margin between selected and rejected experts),
moe_permute and moe_unpermute."""

from __future__ import annotations

import math

import torch

from hetero.verify.inputs.draw import randn
from hetero.verify.inputs.fused_moe import expert_ids, expert_pool, routing_weights

__all__ = ["MARGIN", "permute", "route", "unpermute"]

#: Relative gap required at each routing decision. A float32 router is off by
#: ~1e-6 of a score (softmax over 256 experts, sigmoid plus bias); 1e-3 is 1000x that.
MARGIN = 1e-3
_TRIES = 200


# ---------------------------------------------------------------- route


_SCORES = {
    "softmax": lambda x: x.softmax(dim=-1),
    "sigmoid": torch.sigmoid,
    "sqrtsoftplus": lambda x: torch.nn.functional.softplus(x).sqrt(),
}


def _spaced_logits(
    gen: torch.Generator, m: int, e: int, sigma: tuple[float, float], shift: tuple[float, float]
) -> torch.Tensor:
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


def _select(
    logits: torch.Tensor,
    *,
    top_k: int,
    scoring: str,
    n_group: int,
    topk_group: int,
    bias: torch.Tensor | None,
    group_top2: bool | None = None,
    fill: float = float("-inf"),
) -> tuple[torch.Tensor, torch.Tensor]:
    """The experts route picks, in float64 (sorted per token), and per token whether every
    decision on the way cleared MARGIN. ``group_top2`` (default: bias given) and ``fill``
    (the value of dropped experts) let the builders check that a variant picks differently."""
    scores = _SCORES[scoring](logits.double())
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


def route(
    m: int,
    e: int,
    top_k: int,
    *,
    scoring: str = "softmax",
    renormalize: bool = True,
    n_group: int = 1,
    topk_group: int = 1,
    bias: str | None = None,
    factor: float = 1.0,
    sigma=(1.0, 2.5),
    shift=(0.0, 0.0),
    fixed: bool = False,
):
    """route's inputs: logits drawn per token until every routing decision clears MARGIN in the case dtype.
    ``fixed`` (spec 1.8): hash routing, ``fixed_ids`` given (``_hashed``), nothing selected.

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
        if fixed:
            return _hashed(gen, dtype, m, e, top_k, scoring, renormalize, factor, sigma, shift)
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
        args = {
            "router_logits": logits,
            "top_k": top_k,
            "scoring": scoring,
            "renormalize": renormalize,
            "n_group": n_group,
            "topk_group": topk_group,
            "routed_scaling_factor": factor,
        }
        if b is not None:
            args["correction_bias"] = b
        return args

    return build


#: rows of the token -> experts table the hash-routed cases draw their tokens' ids from
_VOCAB = 96


def _hashed(
    gen: torch.Generator, dtype: torch.dtype, m: int, e: int, top_k: int, scoring, renormalize, factor, sigma, shift
):
    """route with ``fixed_ids = tid2eid[tokens]``: a table of distinct experts per row (DeepSeek-V4's
    ``tid2eid``), tokens drawn with repeats; the ids are never the top-k by score (checked), so a router
    that selects instead of looking up must fail."""
    table = torch.stack([torch.randperm(e, generator=gen)[:top_k] for _ in range(_VOCAB)]).to(torch.int32)
    fixed = table[torch.randint(0, _VOCAB, (m,), generator=gen)]
    logits = _spaced_logits(gen, m, e, sigma, shift).to(dtype)
    chosen = _select(logits, top_k=top_k, scoring=scoring, n_group=1, topk_group=1, bias=None)[0]
    if m and bool((fixed.sort(dim=1).values.long() == chosen).all(dim=1).any()):
        raise RuntimeError("route case: a token's fixed ids are its top-k by score")
    return {
        "router_logits": logits,
        "top_k": top_k,
        "scoring": scoring,
        "renormalize": renormalize,
        "routed_scaling_factor": factor,
        "fixed_ids": fixed,
    }


# ---------------------------------------------------------------- permute / unpermute


def permute(m: int, e: int, k: int, h: int, unused: tuple[int, ...], hot: int = 0):
    """hot > 0: every token picks among ``hot`` experts only (long runs of one expert: stability matters)."""

    def build(gen: torch.Generator, dtype: torch.dtype):
        pool = expert_pool(e, unused)
        if hot:
            pool = pool[torch.randperm(len(pool), generator=gen)[:hot]].sort().values
        return {"x": randn(gen, (m, h), dtype), "ids": expert_ids(gen, m, k, pool), "num_experts": e}

    return build


def unpermute(m: int, e: int, k: int, h: int, scoring: str = "softmax", factor: float = 1.0):
    def build(gen: torch.Generator, dtype: torch.dtype):
        ids = expert_ids(gen, m, k, expert_pool(e, (0, -1)))
        perm = torch.sort(ids.reshape(-1).long(), stable=True).indices
        return {
            "y_sorted": randn(gen, (m * k, h), dtype),
            "perm": perm,
            "weights": routing_weights(gen, m, k, scoring, factor),
        }

    return build
