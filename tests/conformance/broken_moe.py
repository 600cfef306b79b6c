"""Planted bugs of fused_moe's spec 1.3 options (gpt-oss's swigluoai with expert biases, DeepSeek-V4's
swiglu_clamp), in a compact, independent fused_moe: expert by expert over the tokens that picked it,
rounding to x's dtype where the spec does; quantized experts (spec 1.4) on dequantized weights and
fake-quantized activations; packed int4 experts (spec 1.9) through ``broken_int4``'s dequantization.
And of route's spec 1.8 options (DeepSeek-V4's sqrtsoftplus and hash routing),
in a compact route. Each bug-free form must pass every quick case
(``make_control``), which shows each planted bug is the only difference. ``broken_backends.BUGS``
includes ``BUGS`` from here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _one_op import one_op_plugin
from broken_int4 import mini_dequant_int4
from broken_quant import mini_quantize_activation

__all__ = ["BUGS", "mini_fused_moe", "mini_route", "make_control"]


def _act(gu: torch.Tensor, activation: str, alpha: float, limit: float | None, bug: str | None) -> torch.Tensor:
    inter = gu.shape[1] // 2
    if bug == "gate_up_interleaved":  # reads the checkpoint's interleaved columns from the split halves
        gate, up = gu[:, 0::2], gu[:, 1::2]
    else:
        gate, up = gu[:, :inter], gu[:, inter:]
    if activation != "silu" and bug != "swigluoai_no_clamp":
        gate = gate.clamp(max=limit)
        if bug != "swiglu_clamp_up_unclamped":
            up = up.clamp(-limit, limit)
    if activation == "swigluoai":
        return (up + 1) * gate * torch.sigmoid(alpha * gate)
    return F.silu(gate) * up


def _dequant(w: torch.Tensor, scale: torch.Tensor | None, acc: torch.dtype) -> torch.Tensor:
    """One expert's weight [N, K] times its scale (none, one element, [N, 1] or 128x128 blocks)."""
    if scale is None:
        return w.to(acc)
    n, k = w.shape
    s = scale.to(acc).reshape(1, 1) if scale.ndim == 0 else scale.to(acc)
    if s.shape not in ((1, 1), (n, 1)):
        s = s.repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)[:, :k]
    return w.to(acc) * s


def _fake_quant(
    a: torch.Tensor, qdtype: torch.dtype, act_quant: str | None, fmt: str, acc: torch.dtype
) -> torch.Tensor:
    """a as the spec's quantize_activation sees it: quantized (mini_quantize_activation), then dequantized."""
    if act_quant is None:
        return a.to(acc)
    group = 128 if act_quant == "group128" else None
    q, s = mini_quantize_activation(None).__func__(a, dtype=qdtype, group_size=group, scale_fmt=fmt)
    width = a.shape[1] if group is None else group
    return q.to(acc) * s.to(acc).repeat_interleave(width, dim=1)[:, : a.shape[1]]


def mini_fused_moe(bug: str | None):
    """fused_moe; ``bug`` names its one mistake (None: correct). Quantized experts (spec 1.4) run on the
    dequantized weights and fake-quantized activations."""

    def fused_moe(
        x,
        w13,
        w2,
        weights,
        ids,
        *,
        activation="silu",
        alpha=1.702,
        limit=None,
        w13_bias=None,
        w2_bias=None,
        w13_scale=None,
        w2_scale=None,
        act_quant=None,
        act_scale_fmt="float",
        w13_zero_point=None,
        w2_zero_point=None,
        group_size=None,
    ):
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        r = lambda t: t.to(x.dtype).to(acc)  # noqa: E731  the spec's roundings to x's dtype
        fq = lambda t: _fake_quant(t, w13.dtype, act_quant, act_scale_fmt, acc)  # noqa: E731
        shift = 1 if bug == "quant_scale_wrong_expert" else 0  # reads the scales of the expert before
        scale = lambda s, e: None if s is None else s[(e - shift) % s.shape[0]]  # noqa: E731

        def deq(w, s, zp, e):  # spec 1.9: packed int4 experts (group_size given), else _dequant
            if group_size is None:
                return _dequant(w[e], scale(s, e), acc)
            k = x.shape[1] if w is w13 else w13.shape[1] // 2
            return mini_dequant_int4(w[e], scale(s, e), None if zp is None else zp[e], group_size, k, bug).to(acc)

        out = torch.zeros(x.shape, dtype=acc, device=x.device)
        for e in ids.unique().tolist():
            tok, slot = (ids == e).nonzero(as_tuple=True)
            gu = fq(x[tok]) @ deq(w13, w13_scale, w13_zero_point, e).T
            if w13_bias is not None:
                gu = gu + w13_bias[e].to(acc)
            y = r(_act(r(gu), activation, alpha, limit, bug if activation == _BUG_ACT.get(bug, activation) else None))
            y = fq(y.to(x.dtype)) @ deq(w2, w2_scale, w2_zero_point, e).T
            bias = None if w2_bias is None else w2_bias[e].to(acc)
            if bias is not None and bug != "w2_bias_unweighted":
                y = y + bias
            y = r(y) * weights[tok, slot].to(acc)[:, None]
            if bias is not None and bug == "w2_bias_unweighted":  # added to each pair's output after the weighting
                y = y + r(bias)
            out.index_add_(0, tok, y)
        return out.to(x.dtype)

    return staticmethod(fused_moe)


def mini_route(bug: str | None):
    """route, with spec 1.8's sqrtsoftplus scoring and hash routing (fixed_ids); ``bug`` names its one
    mistake (None: correct)."""

    def route(
        router_logits,
        *,
        top_k,
        scoring="softmax",
        renormalize=True,
        n_group=1,
        topk_group=1,
        correction_bias=None,
        routed_scaling_factor=1.0,
        fixed_ids=None,
    ):
        acc = torch.float64 if torch.float64 in (router_logits.dtype, getattr(correction_bias, "dtype", None)) else None
        x = router_logits.to(acc or torch.float32)
        if scoring == "sqrtsoftplus":
            scoring = _SQRTSOFTPLUS_AS.get(bug, scoring)
        scores = {
            "softmax": lambda: x.softmax(-1),
            "sigmoid": lambda: x.sigmoid(),
            "softplus": lambda: F.softplus(x),
            "sqrtsoftplus": lambda: F.softplus(x).sqrt(),
        }[scoring]()
        ids = fixed_ids.long() if fixed_ids is not None and bug != "route_hash_ids_ignored" else None
        if ids is None:
            sel = scores if correction_bias is None else scores + correction_bias.to(scores.dtype)
            if n_group > 1:
                g = sel.view(sel.shape[0], n_group, -1)
                gs = g.topk(2, -1).values.sum(-1) if correction_bias is not None else g.amax(-1)
                drop = torch.ones_like(gs, dtype=torch.bool).scatter_(1, gs.topk(topk_group, -1).indices, False)
                sel = g.masked_fill(drop[..., None], float("-inf")).view_as(sel)
            ids = sel.topk(top_k, -1).indices
        w = scores.gather(1, ids)
        if renormalize:
            w = w / w.sum(-1, keepdim=True)
        return (w * routed_scaling_factor).float(), ids.to(torch.int32)

    return staticmethod(route)


#: the scoring a sqrtsoftplus bug computes instead
_SQRTSOFTPLUS_AS = {"route_sqrtsoftplus_without_sqrt": "softplus", "route_sqrtsoftplus_as_sigmoid": "sigmoid"}

#: bug -> the activation whose calls it breaks (the others run bug-free); absent: every activation
_BUG_ACT = {"swigluoai_no_clamp": "swigluoai", "swiglu_clamp_up_unclamped": "swiglu_clamp"}

#: bug name -> (the op it breaks, its implementation)
BUGS = {
    b: ("fused_moe", mini_fused_moe(b))
    for b in (
        "swigluoai_no_clamp",
        "swiglu_clamp_up_unclamped",
        "w2_bias_unweighted",
        "gate_up_interleaved",
        "quant_scale_wrong_expert",
        "int4_symmetric_zero_point_as_0",  # spec 1.9 (broken_int4.mini_dequant_int4)
    )
}
# spec 1.8's route options: hash routing that selects by score instead of looking up, sqrtsoftplus as another score
BUGS.update({b: ("route", mini_route(b)) for b in ("route_hash_ids_ignored", *_SQRTSOFTPLUS_AS)})

_MINI = {"fused_moe": mini_fused_moe, "route": mini_route}


def make_control(op: str):
    """A plugin providing backend ``control_<op>``: the reference with the bug-free mini ``op``."""
    return one_op_plugin(f"control_{op}", op, _MINI[op](None))
