"""Planted bugs of the recurrent ops (spec 1.2), in a compact, independent causal_conv1d and gated
delta rule: the convolution through ``F.conv1d`` over each sequence, the delta rule token by token
with einsum. Their bug-free forms must pass every quick case (``make_control``), which shows each
planted bug is the only difference. ``broken_backends.BUGS`` includes ``BUGS`` from here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _one_op import one_op_plugin

__all__ = ["BUGS", "mini_causal_conv1d", "mini_gated_delta_rule", "make_control"]


def _acc(*tensors: torch.Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _batch(query_start_loc, state_slots, has_initial_state):
    starts, slots, initial = query_start_loc.tolist(), state_slots.tolist(), has_initial_state.tolist()
    return [(starts[n], starts[n + 1], slot, initial[n]) for n, slot in enumerate(slots)]


def mini_causal_conv1d(bug: str | None):
    """causal_conv1d; ``bug`` names its one mistake (None: correct)."""

    def causal_conv1d(
        x, weight, bias, conv_state, query_start_loc, state_slots, has_initial_state, *, activation="silu"
    ):
        acc, (c, w) = _acc(x, weight), weight.shape
        out = torch.zeros_like(x)
        for a, e, slot, initial in _batch(query_start_loc, state_slots, has_initial_state):
            if e == a or (slot < 0 and bug != "conv_padding_slot_not_skipped"):
                continue  # the bug: slot -1 indexes the last slot
            read = initial or bug == "conv_ignores_has_initial_state"
            prev = conv_state[slot] if read else x.new_zeros(w - 1, c)
            xx = torch.cat([prev, x[a:e]])  # [W-1+L, C]
            y = F.conv1d(
                xx.T[None].to(acc), weight[:, None, :].to(acc), None if bias is None else bias.to(acc), groups=c
            )[0].T
            out[a:e] = (F.silu(y) if activation == "silu" else y).to(x.dtype)
            shift = 1 if bug == "conv_state_shifted_by_one" else 0  # keeps one input too old, drops the newest
            conv_state[slot] = xx[e - a - shift : e - a - shift + w - 1]
        return out

    return staticmethod(causal_conv1d)


def _decay(g_t: torch.Tensor, bug: str | None) -> torch.Tensor:
    """exp(g) shaped to multiply S [HV, K, V]; per key row for a [HV, K] gate (KDA)."""
    if g_t.ndim == 2:
        if bug == "kda_decay_per_head_only":  # takes the first channel's decay for the whole head
            g_t = g_t[:, :1].expand_as(g_t)
        return g_t.exp()[:, :, None]
    return g_t.exp()[:, None, None]


def _normalized(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def mini_gated_delta_rule(bug: str | None):
    """gated_delta_rule; ``bug`` names its one mistake (None: correct)."""

    def gated_delta_rule(
        q, k, v, g, beta, ssm_state, query_start_loc, state_slots, has_initial_state, *, scale, use_qk_l2norm=True
    ):
        acc, (h, hv) = _acc(q, ssm_state), (q.shape[1], v.shape[1])
        heads = torch.arange(hv) % h if bug == "gdr_gva_head_mod" else torch.arange(hv) // (hv // h)
        out = torch.zeros(q.shape[0], hv, v.shape[2], dtype=v.dtype)
        for a, e, slot, initial in _batch(query_start_loc, state_slots, has_initial_state):
            if e == a or slot < 0:
                continue
            qs, ks = q[a:e, heads].to(acc), k[a:e, heads].to(acc)
            if use_qk_l2norm and bug != "gdr_l2norm_missing":
                qs, ks = _normalized(qs), _normalized(ks)
            s = ssm_state[slot].to(acc, copy=True) if initial else torch.zeros(ssm_state.shape[1:], dtype=acc)
            for i, t in enumerate(range(a, e)):
                decay = _decay(g[t].to(acc), bug)
                b = 1.0 if bug == "gdr_beta_dropped" else beta[t].to(acc)[:, None]
                if bug != "gdr_decay_after_update":
                    s = s * decay
                u = b * (v[t].to(acc) - torch.einsum("hk,hkv->hv", ks[i], s))
                s = s + torch.einsum("hk,hv->hkv", ks[i], u)
                if bug == "gdr_decay_after_update":
                    s = s * decay
                out[t] = (scale * torch.einsum("hk,hkv->hv", qs[i], s)).to(v.dtype)
            if bug != "gdr_state_not_written_back":
                ssm_state[slot] = s.to(ssm_state.dtype)
        return out

    return staticmethod(gated_delta_rule)


_CONV = ("conv_state_shifted_by_one", "conv_ignores_has_initial_state", "conv_padding_slot_not_skipped")
_GDR = (
    "gdr_decay_after_update",
    "gdr_beta_dropped",
    "gdr_l2norm_missing",
    "gdr_state_not_written_back",
    "gdr_gva_head_mod",
    "kda_decay_per_head_only",
)

#: bug name -> (the op it breaks, its implementation)
BUGS = {
    **{b: ("causal_conv1d", mini_causal_conv1d(b)) for b in _CONV},
    **{b: ("gated_delta_rule", mini_gated_delta_rule(b)) for b in _GDR},
}

_MINI = {"causal_conv1d": mini_causal_conv1d, "gated_delta_rule": mini_gated_delta_rule}


def make_control(op: str):
    """A plugin providing backend ``control_<op>``: the reference with the bug-free mini ``op``."""
    return one_op_plugin(f"control_{op}", op, _MINI[op](None))
