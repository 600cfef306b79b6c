"""Checks of the recurrent ops' per-token state slots (spec 1.11, speculative decoding), split from
``hetero.spec._checks_recurrent``: ``state_slots`` [N, M] with ``num_accepted_tokens`` [N] or None.

``check_num_accepted_tokens`` reads host metadata only (the always-on check); ``check_token_slots``
reads the index tensors' values (``hetero.spec.validate``'s check of a per-token call, and what the
reference always runs). Every failure is an OpError naming the op, the argument, what was expected
and what came.
"""

from __future__ import annotations

import torch

from hetero.errors import OpError
from hetero.spec._checks_core import INDEX_DTYPES, check_cu_seqlens, check_same_device, check_tensor
from hetero.spec._checks_recurrent import check_state_index

__all__ = ["check_num_accepted_tokens", "check_token_slots"]


def check_num_accepted_tokens(op: str, state_slots: torch.Tensor, num_accepted_tokens: object) -> None:
    """``num_accepted_tokens`` None, or int32/int64 [N] on state_slots' device beside per-token
    ``state_slots`` [N, M] (already checked by ``check_state_index``). Reads no values."""
    if num_accepted_tokens is None:
        return
    if state_slots.ndim != 2:
        raise OpError(
            op,
            "num_accepted_tokens",
            "None with state_slots [N] (it picks the column of per-token state_slots [N, M] to read)",
            f"a {type(num_accepted_tokens).__name__} with state_slots of shape {list(state_slots.shape)}",
        )
    check_tensor(op, "num_accepted_tokens", num_accepted_tokens, shape=(state_slots.shape[0],), dtypes=INDEX_DTYPES)
    check_same_device(op, state_slots=state_slots, num_accepted_tokens=num_accepted_tokens)  # type: ignore[arg-type]


def check_token_slots(
    op: str,
    query_start_loc: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    num_accepted_tokens: torch.Tensor | None,
    tokens: int,
    num_slots: int,
) -> tuple[list[int], list[list[int]], list[bool], list[int]]:
    """The contents of a per-token call: query_start_loc from 0 to T non-decreasing, every sequence
    at most M rows, slots in [-1, S), num_accepted_tokens in [1, M], and the entry a sequence reads
    its initial state from not -1 (a live, non-empty sequence with ``has_initial_state``).

    Returns host lists (query_start_loc, state_slots rows, has_initial_state, the column each
    sequence reads: ``num_accepted_tokens - 1``, 0 when it is None).
    """
    n = check_state_index(op, query_start_loc, state_slots, has_initial_state)
    if state_slots.ndim != 2:
        raise OpError(op, "state_slots", f"shape [{n}, M] (per-token slots)", f"shape {list(state_slots.shape)}")
    check_num_accepted_tokens(op, state_slots, num_accepted_tokens)
    starts = check_cu_seqlens(op, "query_start_loc", query_start_loc, tokens, n)
    m = state_slots.shape[1]
    rows = state_slots.to("cpu", torch.int64)
    if rows.numel():
        lo, hi = int(rows.min()), int(rows.max())
        if not (lo >= -1 and hi < num_slots):
            raise OpError(
                op, "state_slots", f"slots in [-1, {num_slots}) (-1 skips a write)", f"values in [{lo}, {hi}]"
            )
    for i in range(n):
        if starts[i + 1] - starts[i] > m:
            raise OpError(
                op,
                "state_slots",
                f"a column per row of each sequence (M = {m} >= its rows)",
                f"sequence {i} of {starts[i + 1] - starts[i]} rows",
            )
    cols = [0] * n
    if num_accepted_tokens is not None and n:
        accepted = num_accepted_tokens.to("cpu", torch.int64)
        lo, hi = int(accepted.min()), int(accepted.max())
        if not (lo >= 1 and hi <= m):
            raise OpError(
                op, "num_accepted_tokens", f"values in [1, {m}] (M, the slot columns)", f"values in [{lo}, {hi}]"
            )
        cols = [a - 1 for a in accepted.tolist()]
    slots, initial = rows.tolist(), [bool(b) for b in has_initial_state.tolist()]
    for i in range(n):
        if slots[i][0] >= 0 and starts[i + 1] > starts[i] and initial[i] and slots[i][cols[i]] < 0:
            raise OpError(
                op,
                "state_slots",
                "a slot at [n, num_accepted_tokens[n] - 1], where a sequence with an initial state reads it",
                f"-1 at [{i}, {cols[i]}]",
            )
    return starts, slots, initial, cols
