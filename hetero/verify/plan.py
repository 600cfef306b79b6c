"""A call's arguments with the step plan an engine would give them (spec 1.6), for conformance
and ``hetero bench`` to run the planned path of the ops that take one."""

from __future__ import annotations

from typing import Any

import torch

from hetero.ops import PLANNED_OPS, Ops
from hetero.spec.types import AttentionMeta

__all__ = ["plan_kind", "with_plan"]

#: op -> (its query argument, its cache or state argument, whether it reads AttentionMeta)
_ARGS = {
    "paged_attention": ("query", "k_cache", True),
    "mla_attention": ("q_nope", "ckv_cache", True),
    "indexer_topk": ("q", "index_cache", True),
    "causal_conv1d": ("x", "conv_state", False),
    "gated_delta_rule": ("q", "ssm_state", False),
}
_INDEX = ("query_start_loc", "state_slots", "has_initial_state")


def plan_kind(op: str) -> str | None:
    """ "attention" or "recurrent" for an op a step plan serves, else None."""
    return next((kind for kind, ops in PLANNED_OPS.items() if op in ops), None)


def with_plan(ops: Ops, op: str, inputs: dict[str, Any]) -> dict[str, Any] | None:
    """``inputs`` (the op's arguments by name) with the plan ``ops`` makes of their metadata once
    per step, or None when the op takes no plan or the backend has no hook of that kind (then the
    planned path is the unplanned one). The plan is made here, for these very tensors."""
    kind = plan_kind(op)
    if kind is None or kind not in type(ops.backend).plans():
        return None
    if inputs.get("compress_ratio", 1) != 1:  # a step plan is of the attention cache, not a compressed one (1.8)
        return None
    first, store, attention = _ARGS[op]
    query, cache = inputs[first], inputs[store]
    if not (isinstance(query, torch.Tensor) and isinstance(cache, torch.Tensor) and query.ndim and cache.ndim >= 2):
        return None
    if attention:
        meta = inputs["meta"]
        if not isinstance(meta, AttentionMeta):
            return None
        nb, bs = cache.shape[:2]
        planned = ops.plan_attention(meta, num_tokens=query.shape[0], num_blocks=nb, block_size=bs)
        return {**inputs, "meta": planned}
    index = [inputs[k] for k in _INDEX]
    if isinstance(index[1], torch.Tensor) and index[1].ndim != 1:  # per-token slots (spec 1.11) take no plan
        return None
    plan = ops.plan_recurrent(*index, num_tokens=query.shape[0], num_slots=cache.shape[0])
    return {**inputs, "plan": plan}
