"""Reference recurrent ops of linear-attention layers: the short causal convolution and the
gated delta rule, each carrying a per-sequence state slot from one call to the next.

Written literally from the spec (``hetero.spec.recurrent``): a loop over sequences, and for
the delta rule a loop over each sequence's rows, one state update per token. Accumulation is
in float32 (float64 when any input is float64, the oracle run); outputs take the input's
dtype, states keep theirs. A slot of -1 leaves its rows 0 and touches no state; an empty
sequence touches nothing; a slot without initial state is never read. Both slot layouts run
one path: a sequence reads one slot (or none) before its rows and writes after some rows, the
last one for [N] slots, every row with a slot for per-token slots [N, M] (spec 1.11).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hetero.spec.checks import (
    L2NORM_EPS,
    check_causal_conv1d,
    check_gated_delta_rule,
    check_num_accepted_tokens,
    check_state_batch,
    check_token_slots,
)
from hetero.spec.types import Plan
from hetero_cpu_ref._util import acc_dtype, one_intra_op_thread, up

__all__ = ["causal_conv1d", "gated_delta_rule"]


def _sequences(op: str, index: tuple[torch.Tensor, ...], accepted: torch.Tensor | None, tokens: int, num_slots: int):
    """(rows start, end, the slot read or None, {row t: slot written after it}) of each sequence that
    reads or writes state, its index values checked first."""
    query_start_loc, state_slots, has_initial_state = index
    check_num_accepted_tokens(op, state_slots, accepted)
    if state_slots.ndim == 1:
        starts, slots, initial = check_state_batch(op, *index, tokens, num_slots)
        rows, cols = [[slot] for slot in slots], [0] * len(slots)
    else:
        starts, rows, initial, cols = check_token_slots(op, *index, accepted, tokens, num_slots)
    for n, row in enumerate(rows):
        a, e = starts[n], starts[n + 1]
        if row[0] < 0 or e == a:
            continue
        if state_slots.ndim == 1:
            writes = {e - a - 1: row[0]}  # the state after the last row
        else:
            writes = {t: row[t] for t in range(e - a) if row[t] >= 0}
        yield a, e, row[cols[n]] if initial[n] else None, writes


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    query_start_loc: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    *,
    activation: str | None = "silu",
    plan: Plan | None = None,  # a step plan changes nothing here: the reference checks every call
    num_accepted_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    op = "causal_conv1d"
    tokens, channels, width, num_slots = check_causal_conv1d(
        op, x, weight, bias, conv_state, query_start_loc, state_slots, has_initial_state, activation
    )
    index = (query_start_loc, state_slots, has_initial_state)
    seqs = list(_sequences(op, index, num_accepted_tokens, tokens, num_slots))

    acc = acc_dtype(x, weight, bias, conv_state)
    w = up(weight, acc)
    out = torch.zeros(tokens, channels, dtype=x.dtype, device=x.device)  # rows of skipped sequences stay 0
    for a, e, read, writes in seqs:
        n = e - a
        prev = conv_state[read] if read is not None else x.new_zeros(width - 1, channels)
        xx = torch.cat([prev, x[a:e]])  # [W-1+L, C], oldest first, in x's dtype (a copy: read before any write)
        xa = up(xx, acc)
        y = sum(w[:, j] * xa[j : j + n] for j in range(width))  # y[t] = sum_j weight[:, j] * xx[t+j]
        if bias is not None:
            y = y + up(bias, acc)
        if activation == "silu":
            y = F.silu(y)
        out[a:e] = y.to(x.dtype)
        for t, slot in writes.items():
            conv_state[slot] = xx[t + 1 : t + width]  # the last W-1 inputs up to row t, old state included
    return out


def _l2n(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum(x**2) + eps) over the last dimension (eps inside the root, as the spec states)."""
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + L2NORM_EPS)


def _delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    out: torch.Tensor,
    writes: dict[int, int],
    ssm_state: torch.Tensor,
) -> None:
    """One sequence, token by token, all heads at once, updating ``state`` [HV, K, V] in place:
    q, k [L, HV, K] (already normalized, scaled and expanded to value heads), v [L, HV, V],
    decay [L, HV, K or 1, 1], beta [L, HV]. Writes out [L, HV, V], and S after row t to
    ``ssm_state[writes[t]]``."""
    for t in range(q.shape[0]):
        state.mul_(decay[t])
        predicted = torch.bmm(k[t, :, None, :], state)[:, 0]  # k^T S: what S already says for k, [HV, V]
        u = beta[t, :, None] * (v[t] - predicted)
        state.baddbmm_(k[t, :, :, None], u[:, None, :])  # S + outer(k, u)
        out[t] = torch.bmm(q[t, :, None, :], state)[:, 0]
        if t in writes:
            ssm_state[writes[t]] = state.to(ssm_state.dtype)


def _sequence_inputs(
    q: torch.Tensor, k: torch.Tensor, g: torch.Tensor, *, scale: float, ratio: int, l2norm: bool, acc: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One sequence's (scale * normalized q, normalized k), both expanded to value heads, and the
    decay exp(g) shaped to multiply S [HV, K, V]: per head, or per key row (g [L, HV, K])."""
    qs, ks = up(q, acc), up(k, acc)
    if l2norm:
        qs, ks = _l2n(qs), _l2n(ks)
    qs = (qs * float(scale)).repeat_interleave(ratio, dim=1)
    ks = ks.repeat_interleave(ratio, dim=1)
    decay = torch.exp(up(g, acc))
    return qs, ks, decay[..., None] if g.ndim == 3 else decay[..., None, None]


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm_state: torch.Tensor,
    query_start_loc: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    *,
    scale: float,
    use_qk_l2norm: bool = True,
    plan: Plan | None = None,
    num_accepted_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    op = "gated_delta_rule"
    tokens, heads, _, vheads, vdim, num_slots = check_gated_delta_rule(
        op, q, k, v, g, beta, ssm_state, query_start_loc, state_slots, has_initial_state, scale, use_qk_l2norm
    )
    index = (query_start_loc, state_slots, has_initial_state)
    seqs = list(_sequences(op, index, num_accepted_tokens, tokens, num_slots))

    acc = acc_dtype(q, k, v, g, beta, ssm_state)
    opts = {
        "scale": scale,
        "ratio": vheads // heads,
        "l2norm": use_qk_l2norm,
        "acc": acc,
    }  # value head i: key head i // ratio
    out = torch.zeros(tokens, vheads, vdim, dtype=v.dtype, device=v.device)  # rows of skipped sequences stay 0
    with one_intra_op_thread():  # many small ops per sequence and row: see _util
        for a, e, read, writes in seqs:
            qs, ks, decay = _sequence_inputs(q[a:e], k[a:e], g[a:e], **opts)
            # a copy, read before any write (the slot read may be written after a row); never read
            # without an initial state: the slot may hold anything, NaN included
            shape = ssm_state.shape[1:]
            state = ssm_state[read].to(acc, copy=True) if read is not None else ssm_state.new_zeros(shape, dtype=acc)
            seq_out = torch.empty(e - a, vheads, vdim, dtype=acc, device=v.device)
            _delta_rule(qs, ks, up(v[a:e], acc), decay, up(beta[a:e], acc), state, seq_out, writes, ssm_state)
            out[a:e] = seq_out.to(v.dtype)
    return out
