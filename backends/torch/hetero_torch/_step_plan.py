"""The torch backend's step plans (spec 1.6): what every layer of a step would otherwise redo.

``plan_attention`` reads the metadata's values on the host once (``check_meta``: the padded
groups of the batched path need them, and every gather index is then known in range), keeps the
int32 contiguous copies the native kernels take, and builds the padded groups (``_attention_plan``)
once per head count on first use. ``plan_recurrent`` does the same for the recurrent ops' index
lists and groups. An op finds its plan with :func:`attention` / :func:`recurrent`, which return
None unless the call's tensors and sizes are those the plan was made for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hetero.spec.checks import check_meta, check_state_batch
from hetero.spec.types import AttentionMeta, Plan
from hetero_torch import _attention_native, _attention_plan, _recurrent_plan

__all__ = ["AttentionPlan", "RecurrentPlan", "plan_attention", "plan_recurrent", "attention", "recurrent"]


@dataclass
class AttentionPlan:
    """Host lists (query_start_loc, seq_lens), the int32 metadata the native kernels read, and the
    padded groups of the batched path by (query heads, device), built on first use."""

    starts: list[int]
    seq_lens: list[int]
    native: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    _groups: dict[tuple[int, torch.device, int], list[_attention_plan.Batch]] = field(default_factory=dict)

    def groups(self, heads: int, device: torch.device, first: int = 0) -> list[_attention_plan.Batch]:
        """The padded groups of sequences [first, B), their rows counted from sequence ``first``'s."""
        key = (heads, device, first)
        if key not in self._groups:
            starts = [s - self.starts[first] for s in self.starts[first:]]
            self._groups[key] = _attention_plan.plan(starts, self.seq_lens[first:], heads, device)
        return self._groups[key]


@dataclass
class RecurrentPlan:
    """Host lists (starts, slots, initial) and the padded groups by (device, chunk), built on first use."""

    starts: list[int]
    slots: list[int]
    initial: list[bool]
    _groups: dict[tuple[torch.device, int | None], list[_recurrent_plan.Batch]] = field(default_factory=dict)

    def groups(self, device: torch.device, chunk: int | None = None) -> list[_recurrent_plan.Batch]:
        key = (device, chunk)
        if key not in self._groups:
            self._groups[key] = _recurrent_plan.plan(self.starts, self.slots, self.initial, device, chunk)
        return self._groups[key]


def plan_attention(meta: AttentionMeta, *, num_tokens: int, num_blocks: int, block_size: int) -> AttentionPlan:
    starts, seq_lens = check_meta("plan_attention", meta, num_tokens, num_blocks, block_size)
    return AttentionPlan(starts, seq_lens, _attention_native.index_of(meta))


def plan_recurrent(
    query_start_loc: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    *,
    num_tokens: int,
    num_slots: int,
) -> RecurrentPlan:
    index = (query_start_loc, state_slots, has_initial_state)
    starts, slots, initial = check_state_batch("plan_recurrent", *index, num_tokens, num_slots)
    return RecurrentPlan(starts, slots, initial)


def attention(meta: AttentionMeta, num_tokens: int, num_blocks: int, block_size: int) -> AttentionPlan | None:
    """This backend's plan of ``meta`` when it serves a call over T tokens and an NB x BS cache."""
    plan = meta.planned(num_tokens, num_blocks, block_size)
    return plan.data if plan is not None and isinstance(plan.data, AttentionPlan) else None


def recurrent(plan: Plan | None, index: tuple[torch.Tensor, ...], tokens: int, num_slots: int) -> RecurrentPlan | None:
    """This backend's plan of the recurrent index tensors when it serves a call over T tokens and S slots."""
    if isinstance(plan, Plan) and isinstance(plan.data, RecurrentPlan) and plan.serves(index, (tokens, num_slots)):
        return plan.data
    return None
