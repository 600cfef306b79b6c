"""Index-content validators of the recurrent ops (``hetero.spec.validate`` lists them), split from
it: [N] state slots as since spec 1.2 (skipped when a checked step plan serves the call), and
per-token slots [N, M] with ``num_accepted_tokens`` (spec 1.11), which no plan serves."""

from __future__ import annotations

import torch

from hetero.spec._checks_core import check_tensor
from hetero.spec._checks_recurrent import check_state_batch
from hetero.spec._checks_token_slots import check_num_accepted_tokens, check_token_slots
from hetero.spec.types import Plan

__all__ = ["causal_conv1d", "gated_delta_rule"]


def _rows(op: str, arg: str, x: object, ndim: int) -> int:
    check_tensor(op, arg, x, ndim=ndim)
    assert isinstance(x, torch.Tensor)
    return x.shape[0]


def _states(
    op: str, index: tuple[torch.Tensor, ...], tokens: int, num_slots: int, plan: object, accepted: object
) -> None:
    if isinstance(index[1], torch.Tensor) and index[1].ndim == 2:
        check_token_slots(op, *index, accepted, tokens, num_slots)  # type: ignore[arg-type]
        return
    if not (isinstance(plan, Plan) and plan.checked and plan.serves(index, (tokens, num_slots))):
        check_state_batch(op, *index, tokens, num_slots)
    check_num_accepted_tokens(op, index[1], accepted)  # with [N] slots: None only


def causal_conv1d(
    x: torch.Tensor,
    weight: object,
    bias: object,
    conv_state: torch.Tensor,
    query_start_loc: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    *,
    plan: object = None,
    num_accepted_tokens: object = None,
    **_: object,
) -> None:
    """query_start_loc [N+1] from 0 to T non-decreasing; state_slots [N] in [-1, S); has_initial_state bool [N].
    Per-token slots [N, M]: every sequence at most M rows, num_accepted_tokens in [1, M], the entry a
    sequence reads not -1 (``check_token_slots``)."""
    op = "causal_conv1d"
    index = (query_start_loc, state_slots, has_initial_state)
    tokens, slots = _rows(op, "x", x, 2), _rows(op, "conv_state", conv_state, 3)
    _states(op, index, tokens, slots, plan, num_accepted_tokens)


def gated_delta_rule(
    q: torch.Tensor,
    k: object,
    v: object,
    g: object,
    beta: object,
    ssm_state: torch.Tensor,
    query_start_loc: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    *,
    plan: object = None,
    num_accepted_tokens: object = None,
    **_: object,
) -> None:
    """As causal_conv1d, with S = ssm_state.shape[0] and T = q.shape[0]."""
    op = "gated_delta_rule"
    index = (query_start_loc, state_slots, has_initial_state)
    tokens, slots = _rows(op, "q", q, 3), _rows(op, "ssm_state", ssm_state, 4)
    _states(op, index, tokens, slots, plan, num_accepted_tokens)
