"""Argument checks of the recurrent ops (``causal_conv1d``, ``gated_delta_rule``), split from
``hetero.spec.checks``, which they build on. Every failure is an OpError naming the op, the
argument, what was expected and what came.

``check_causal_conv1d`` and ``check_gated_delta_rule`` read host metadata only (shapes,
dtypes, devices): they are the always-on checks. ``check_state_batch`` reads the index
tensors' values (a device-to-host copy on an accelerator): it is what
``hetero.spec.validate`` runs when validation is on, and what the reference always runs.
"""

from __future__ import annotations

import math
import numbers

import torch

from hetero.errors import OpError
from hetero.spec._checks_core import INDEX_DTYPES, check_cu_seqlens, check_same_device, check_tensor
from hetero.spec.types import FLOAT_DTYPES

__all__ = [
    "CONV_ACTIVATIONS",
    "STATE_DTYPES",
    "L2NORM_EPS",
    "check_state_index",
    "check_state_batch",
    "check_causal_conv1d",
    "check_gated_delta_rule",
]

#: The activations causal_conv1d applies after the convolution (None: the identity).
CONV_ACTIVATIONS = ("silu", None)
#: gated_delta_rule's g and ssm_state are float32 by the spec; float64 is the oracle's run.
STATE_DTYPES = (torch.float32, torch.float64)
#: The epsilon inside the square root of gated_delta_rule's l2 normalization of q and k.
L2NORM_EPS = 1e-6


def check_state_index(op: str, query_start_loc: object, state_slots: object, has_initial_state: object) -> int:
    """The three per-sequence index tensors' types and shapes; returns N, the sequence count.

    query_start_loc int32 [N+1] (int64 accepted, as for every metadata tensor),
    state_slots int32 [N], or [N, M] with M >= 1 (per-token slots, spec 1.11),
    has_initial_state bool [N]. Reads no values.
    """
    check_tensor(op, "query_start_loc", query_start_loc, ndim=1, dtypes=INDEX_DTYPES)
    assert isinstance(query_start_loc, torch.Tensor)
    if not (query_start_loc.shape[0] >= 1):
        raise OpError(op, "query_start_loc", "at least one entry (N+1)", "shape [0]")
    n = query_start_loc.shape[0] - 1
    per_token = isinstance(state_slots, torch.Tensor) and state_slots.ndim == 2
    if per_token and not (state_slots.shape[0] == n and state_slots.shape[1] >= 1):  # type: ignore[union-attr]
        raise OpError(
            op,
            "state_slots",
            f"shape [{n}] or [{n}, M] with M >= 1 (per-token slots)",
            f"shape {list(state_slots.shape)}",
        )
    check_tensor(op, "state_slots", state_slots, shape=(n, None) if per_token else (n,), dtypes=INDEX_DTYPES)
    check_tensor(op, "has_initial_state", has_initial_state, shape=(n,), dtypes=(torch.bool,))
    return n


def check_state_batch(
    op: str,
    query_start_loc: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    tokens: int,
    num_slots: int,
) -> tuple[list[int], list[int], list[bool]]:
    """The index contents: query_start_loc from 0 to T non-decreasing, state slots in [-1, S).

    Returns host lists (query_start_loc, state_slots, has_initial_state). Slots [N] only: per-token
    slots [N, M] take no step plan, and their calls are checked by ``check_token_slots``.
    """
    n = check_state_index(op, query_start_loc, state_slots, has_initial_state)
    if state_slots.ndim != 1:
        raise OpError(
            op,
            "state_slots",
            f"shape [{n}] (per-token slots [N, M] take no step plan)",
            f"shape {list(state_slots.shape)}",
        )
    starts = check_cu_seqlens(op, "query_start_loc", query_start_loc, tokens, n)
    slots = state_slots.to("cpu", torch.int64).tolist()
    if slots:
        lo, hi = min(slots), max(slots)
        if not (lo >= -1 and hi < num_slots):
            raise OpError(
                op, "state_slots", f"slots in [-1, {num_slots}) (-1 skips the sequence)", f"values in [{lo}, {hi}]"
            )
    return starts, slots, [bool(b) for b in has_initial_state.tolist()]


def check_causal_conv1d(
    op: str,
    x: object,
    weight: object,
    bias: object,
    conv_state: object,
    query_start_loc: object,
    state_slots: object,
    has_initial_state: object,
    activation: object,
) -> tuple[int, int, int, int]:
    """x [T, C], weight [C, W] (W >= 2), bias [C] or None, conv_state [S, W-1, C], all of x's
    float dtype; the index tensors; activation "silu" or None. Returns (T, C, W, S)."""
    check_tensor(op, "x", x, ndim=2, dtypes=FLOAT_DTYPES)
    assert isinstance(x, torch.Tensor)
    (t, c), dt = x.shape, (x.dtype,)
    check_tensor(op, "weight", weight, shape=(c, None), dtypes=dt)
    assert isinstance(weight, torch.Tensor)
    w = weight.shape[1]
    if not (w >= 2):
        raise OpError(op, "weight", "a kernel width W >= 2 (shape [C, W])", f"shape {list(weight.shape)}")
    if bias is not None:
        check_tensor(op, "bias", bias, shape=(c,), dtypes=dt)
    check_tensor(op, "conv_state", conv_state, shape=(None, w - 1, c), dtypes=dt)
    assert isinstance(conv_state, torch.Tensor)
    check_state_index(op, query_start_loc, state_slots, has_initial_state)
    if activation not in CONV_ACTIVATIONS:
        raise OpError(op, "activation", "'silu' or None", repr(activation))
    check_same_device(
        op,
        x=x,
        weight=weight,
        bias=bias,
        conv_state=conv_state,
        query_start_loc=query_start_loc,
        state_slots=state_slots,
        has_initial_state=has_initial_state,
    )
    return t, c, w, conv_state.shape[0]


def _check_gates(op: str, g: object, beta: object, t: int, hv: int, kdim: int, v_dtype: torch.dtype) -> None:
    """g [T, HV] or [T, HV, K] float32; beta [T, HV] float32 or v's dtype."""
    check_tensor(op, "g", g, dtypes=STATE_DTYPES)
    assert isinstance(g, torch.Tensor)
    ok = tuple(g.shape) in ((t, hv), (t, hv, kdim))
    if not ok:
        raise OpError(
            op, "g", f"shape [{t}, {hv}] (per head) or [{t}, {hv}, {kdim}] (per key channel)", f"shape {list(g.shape)}"
        )
    beta_dtypes = tuple(dict.fromkeys((*STATE_DTYPES, v_dtype)))
    check_tensor(op, "beta", beta, shape=(t, hv), dtypes=beta_dtypes)


def check_gated_delta_rule(
    op: str,
    q: object,
    k: object,
    v: object,
    g: object,
    beta: object,
    ssm_state: object,
    query_start_loc: object,
    state_slots: object,
    has_initial_state: object,
    scale: object,
    use_qk_l2norm: object,
) -> tuple[int, int, int, int, int, int]:
    """q, k [T, H, K] and v [T, HV, V] of one float dtype with HV a multiple of H; the gates;
    ssm_state [S, HV, K, V] float32; the index tensors; scale a finite number; use_qk_l2norm a bool.
    Returns (T, H, K, HV, V, S)."""
    check_tensor(op, "q", q, ndim=3, dtypes=FLOAT_DTYPES)
    assert isinstance(q, torch.Tensor)
    (t, h, kdim), dt = q.shape, (q.dtype,)
    check_tensor(op, "k", k, shape=(t, h, kdim), dtypes=dt)
    check_tensor(op, "v", v, shape=(t, None, None), dtypes=dt)
    assert isinstance(v, torch.Tensor)
    hv, vdim = v.shape[1], v.shape[2]
    if not (h >= 1 and hv % h == 0):
        raise OpError(
            op,
            "v",
            f"a value head count that is a multiple of the {h} key heads (shape [T, HV, V])",
            f"shape {list(v.shape)}",
        )
    _check_gates(op, g, beta, t, hv, kdim, v.dtype)
    check_tensor(op, "ssm_state", ssm_state, shape=(None, hv, kdim, vdim), dtypes=STATE_DTYPES)
    assert isinstance(ssm_state, torch.Tensor)
    check_state_index(op, query_start_loc, state_slots, has_initial_state)
    ok_scale = isinstance(scale, numbers.Real) and not isinstance(scale, bool) and math.isfinite(scale)
    if not ok_scale:
        raise OpError(op, "scale", "a finite number (K**-0.5 for Gated DeltaNet)", repr(scale))
    if not isinstance(use_qk_l2norm, bool):
        raise OpError(op, "use_qk_l2norm", "a bool", repr(use_qk_l2norm))
    check_same_device(
        op,
        q=q,
        k=k,
        v=v,
        g=g,
        beta=beta,
        ssm_state=ssm_state,
        query_start_loc=query_start_loc,
        state_slots=state_slots,
        has_initial_state=has_initial_state,
    )
    return t, h, kdim, hv, vdim, ssm_state.shape[0]
