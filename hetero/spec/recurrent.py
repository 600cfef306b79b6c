"""Recurrent operators of linear-attention layers (Gated DeltaNet, KDA): a short causal convolution and the
gated delta rule, each carrying a per-sequence state from one call to the next.

Shapes: T tokens packed token-major in N sequences; sequence n owns rows
``[query_start_loc[n], query_start_loc[n+1])`` (``query_start_loc`` int32 [N+1],
non-decreasing, from 0 to T) and state slot ``state_slots[n]`` (int32 [N], in [-1, S))
of a state tensor with S slots; a slot of -1 skips the sequence: its output rows are 0
and no state is read or written. ``has_initial_state`` (bool [N]) says whether
the slot holds the state after the sequence's earlier tokens; when False the
state starts at 0 and the slot's old contents (garbage, NaN included) are never read. One call
serves prefill, chunked prefill (the state carries the chunks) and decode
(every sequence one row, ``has_initial_state`` True). Two sequences naming the
same slot is undefined. T = 0 or an empty sequence touches nothing of its own: an empty
sequence's slot keeps its contents whatever ``has_initial_state`` says. Index tensors may
also be int64, as everywhere in the spec; their contents are checked when validation is on
(``hetero.spec.validate``).

``plan`` (spec 1.6): the step's :class:`~hetero.spec.types.Plan` of these three index tensors
(``hetero.Ops.plan_recurrent``), made once per step for every layer; optional, and it never
changes the result. An implementation uses it only where :meth:`Plan.serves` these tensors.

Per-token state slots (spec 1.11, speculative decoding: one call verifies 1+k tokens of a
sequence and keeps the state after each, so the caller continues from the last accepted one).
``state_slots`` may be int32 [N, M] (M >= 1) instead of [N]. Then sequence n, of L <= M rows,
writes the state after its row t (t = 0..L-1, counted within the sequence) to slot
``state_slots[n, t]``; an entry of -1 skips that one write, and entries t >= L are never read.
``state_slots[n, 0] == -1`` skips the whole sequence, as -1 does in [N]: its output rows are 0
and no state is read or written, whatever its other entries hold. ``num_accepted_tokens``
(int32 [N] or None; only with [N, M] slots): with a = ``num_accepted_tokens[n]`` in [1, M]
(None: a = 1), a sequence with ``has_initial_state[n]`` reads its initial state from slot
``state_slots[n, a-1]``, which is not -1; it reads it before any write of the call, so that
slot may also be one the sequence writes. A slot written twice in one call (by two rows of one
sequence or by two sequences), or written by one sequence and read by another, is undefined.
The contents are checked as every index is (``hetero.spec.validate``): entries in [-1, S),
L <= M for every sequence, a in [1, M], the read entry not -1. Per-token calls take no step
plan: ``plan_recurrent`` plans [N] slots only, so a plan given with [N, M] slots serves nothing.
In ``supports()`` and conformance, the static option ``num_accepted_tokens=True`` names the
per-token form (whether or not a call passes the tensor).

The logical state layouts are the ones below. A backend may keep another
physical layout only behind ``supports()`` with the reason; callers always pass
the spec's.
"""

from __future__ import annotations

import torch

from hetero.spec._op import Output, spec_op
from hetero.spec.types import Plan

__all__ = ["causal_conv1d", "gated_delta_rule"]


@spec_op(returns=("out",), mutates=(Output("conv_state", "exact"),))
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
    plan: Plan | None = None,
    num_accepted_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Depthwise causal convolution over time, per sequence, continuing from its state.

    x [T, C] (float32/float16/bfloat16), weight [C, W] of x's dtype (W >= 2; a
    Hugging Face ``conv1d.weight [C, 1, W]`` squeezed), bias [C] of x's dtype or None,
    conv_state [S, W-1, C] of x's dtype: the sequence's last W-1 inputs, oldest
    first (row W-2 is the newest). For sequence n with rows s..e-1 (L = e - s)
    and slot p::

        prev = conv_state[p] if has_initial_state[n] else zeros [W-1, C]
        xx   = cat(prev, x[s:e])                          # [W-1+L, C]
        out[s+t, c] = act(sum_j weight[c, j] * xx[t+j, c] + bias[c])    t < L, j < W
        conv_state[p] = xx[L:]                            # the last W-1 inputs

    (so with L < W-1 the new state keeps part of the old one, or zeros). With per-token slots
    [N, M] (see the module): ``prev = conv_state[state_slots[n, a-1]]`` (or zeros), and for
    every row t < L with ``state_slots[n, t] != -1``, ``conv_state[state_slots[n, t]] =
    xx[t+1 : t+W]``, the last W-1 inputs up to and including row t. ``activation``:
    "silu" or None. Sums in float32 or wider, ``out`` [T, C] in x's dtype;
    conv_state is written with exact copies of inputs (compared bit for bit).
    """


@spec_op(returns=("out",), mutates=("ssm_state",))
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
    """The gated delta rule: a decayed fast-weight state S [K, V] per value head, corrected toward each value.

    q, k [T, H, K] and v [T, HV, V] of one float dtype, HV a multiple of H (value
    head i uses key head i // (HV / H), the grouped layout of Qwen3-Next and fla); g float32,
    log-decay (<= 0 in the models), either [T, HV] (one per head: Gated DeltaNet) or
    [T, HV, K] (one per key channel: KDA); beta [T, HV] (float32 or v's dtype);
    ssm_state [S, HV, K, V] float32, S[k, v]. Per sequence n (slot p), value head i,
    key head h = i // (HV / H), in row order::

        S = ssm_state[p, i] if has_initial_state[n] else 0
        for each row t of n:
            qt, kt = q[t, h], k[t, h]
            if use_qk_l2norm: qt, kt = qt / sqrt(sum(qt**2) + 1e-6), kt / sqrt(sum(kt**2) + 1e-6)
            S = S * exp(g[t, i])          # [T, HV]: a scalar; [T, HV, K]: row r of S times exp(g[t, i, r])
            u = beta[t, i] * (v[t, i] - kt @ S)          # [V]
            S = S + outer(kt, u)
            out[t, i] = (scale * qt) @ S                 # [V]
        ssm_state[p, i] = S

    With per-token slots [N, M] (see the module): S starts from ``ssm_state[state_slots[n, a-1], i]``
    (or 0), and after row t (t = 0..L-1 within the sequence) ``ssm_state[state_slots[n, t], i] = S``
    unless that entry is -1; every per-token state is held to float32 as the final one is.

    ``scale`` is explicit (Gated DeltaNet and KDA: K**-0.5). Computed in float32 or
    wider, the l2 norms included, and S stays float32 from row to row: an implementation
    that rounds S or the operands of its products with S to a narrower type computes a
    coarser state (conformance holds ``ssm_state`` to float32 in every case). ``out``
    [T, HV, V] in v's dtype. The gates are the caller's: Gated DeltaNet's ``g = -exp(A_log) *
    softplus(a + dt_bias)`` and ``beta = sigmoid(b)`` are not part of the op. A
    chunked evaluation (WY/UT form) is an implementation of this recurrence and
    is held to it.
    """
