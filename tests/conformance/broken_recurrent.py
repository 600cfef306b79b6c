"""Planted bugs of the recurrent ops (spec 1.2), in a compact, independent causal_conv1d and gated
delta rule: the convolution through ``F.conv1d`` over each sequence, the delta rule token by token
with einsum; both take per-token state slots (spec 1.11). Their bug-free forms must pass every quick
case (``make_control``), which shows each planted bug is the only difference. ``broken_backends.BUGS``
includes ``BUGS`` from here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _one_op import one_op_plugin

__all__ = ["BUGS", "mini_causal_conv1d", "mini_gated_delta_rule", "make_control"]


def _acc(*tensors: torch.Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _batch(query_start_loc, state_slots, has_initial_state, accepted, bug):
    """Per sequence: (rows start, end, column 0's slot, the slot read, has initial state, {row: slot written})."""
    starts, initial = query_start_loc.tolist(), has_initial_state.tolist()
    per_token = state_slots.ndim == 2
    rows = state_slots.tolist() if per_token else [[slot] for slot in state_slots.tolist()]
    cols = [a - 1 for a in accepted.tolist()] if accepted is not None else [0] * len(rows)
    if bug == "gdr_token_reads_column_zero":  # ignores num_accepted_tokens
        cols = [0] * len(rows)
    seqs = []
    for n, row in enumerate(rows):
        a, e = starts[n], starts[n + 1]
        writes = {t: row[t] for t in range(e - a) if row[t] >= 0} if per_token else {e - a - 1: row[0]}
        if per_token and bug == "gdr_token_writes_final_only":
            writes = {t: p for t, p in writes.items() if t == e - a - 1}
        seqs.append((a, e, row[0], row[cols[n]], initial[n], writes))
    return seqs


def mini_causal_conv1d(bug: str | None):
    """causal_conv1d; ``bug`` names its one mistake (None: correct)."""

    def causal_conv1d(
        x,
        weight,
        bias,
        conv_state,
        query_start_loc,
        state_slots,
        has_initial_state,
        *,
        activation="silu",
        num_accepted_tokens=None,
    ):
        acc, (c, w) = _acc(x, weight), weight.shape
        out = torch.zeros_like(x)
        index = (query_start_loc, state_slots, has_initial_state, num_accepted_tokens, bug)
        for a, e, slot, source, initial, writes in _batch(*index):
            if e == a or (slot < 0 and bug != "conv_padding_slot_not_skipped"):
                continue  # the bug: slot -1 indexes the last slot
            read = initial or bug == "conv_ignores_has_initial_state"
            prev = conv_state[source] if read else x.new_zeros(w - 1, c)
            xx = torch.cat([prev, x[a:e]])  # [W-1+L, C]
            y = F.conv1d(
                xx.T[None].to(acc), weight[:, None, :].to(acc), None if bias is None else bias.to(acc), groups=c
            )[0].T
            out[a:e] = (F.silu(y) if activation == "silu" else y).to(x.dtype)
            shift = 1 if bug == "conv_state_shifted_by_one" else 0  # keeps one input too old, drops the newest
            if state_slots.ndim == 2 and bug == "conv_token_state_off_by_one":
                shift = 1  # per-token slots only: the state before row t, not after it
            for t, p in writes.items():
                conv_state[p] = xx[t + 1 - shift : t + 1 - shift + w - 1]
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
        q,
        k,
        v,
        g,
        beta,
        ssm_state,
        query_start_loc,
        state_slots,
        has_initial_state,
        *,
        scale,
        use_qk_l2norm=True,
        num_accepted_tokens=None,
    ):
        acc, (h, hv) = _acc(q, ssm_state), (q.shape[1], v.shape[1])
        heads = torch.arange(hv) % h if bug == "gdr_gva_head_mod" else torch.arange(hv) // (hv // h)
        out = torch.zeros(q.shape[0], hv, v.shape[2], dtype=v.dtype)
        index = (query_start_loc, state_slots, has_initial_state, num_accepted_tokens, bug)
        for a, e, slot, source, initial, writes in _batch(*index):
            if e == a or slot < 0:
                continue
            qs, ks = q[a:e, heads].to(acc), k[a:e, heads].to(acc)
            if use_qk_l2norm and bug != "gdr_l2norm_missing":
                qs, ks = _normalized(qs), _normalized(ks)
            s = ssm_state[source].to(acc, copy=True) if initial else torch.zeros(ssm_state.shape[1:], dtype=acc)
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
                if i in writes and bug != "gdr_state_not_written_back":
                    ssm_state[writes[i]] = s.to(ssm_state.dtype)
        return out

    return staticmethod(gated_delta_rule)


_CONV = (
    "conv_state_shifted_by_one",
    "conv_ignores_has_initial_state",
    "conv_padding_slot_not_skipped",
    "conv_token_state_off_by_one",  # spec 1.11: per-token slots
)
_GDR = (
    "gdr_token_reads_column_zero",  # spec 1.11: per-token slots
    "gdr_token_writes_final_only",
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
