"""What each op produces, by name, and how each output is compared."""
from __future__ import annotations

from typing import Any

import torch

__all__ = ["outputs_of", "kind_of", "INPLACE", "align_route"]

#: In-place ops: their outputs are these arguments after the call.
INPLACE = {"write_kv": ("k_cache", "v_cache"), "write_mla_kv": ("ckv_cache", "kpe_cache")}
_NAMES = {
    "route": ("weights", "ids"),
    "moe_permute": ("x_sorted", "group_ends", "perm"),
    "merge_attention": ("out", "lse"),
    "rotary_embedding": ("q", "k"),
    "rms_norm": ("out", "residual"),
}
_KINDS = {("route", "ids"): "ids_as_sets", ("moe_permute", "group_ends"): "exact", ("moe_permute", "perm"): "exact"}


class OutputMismatch(Exception):
    """The op returned the wrong number or kind of results."""


def outputs_of(op: str, inputs: dict[str, Any], result: Any) -> dict[str, torch.Tensor]:
    """The named outputs of one call: in-place arguments, a tensor, or a tuple of tensors."""
    if op in INPLACE:
        if result is not None:
            raise OutputMismatch(f"returned {type(result).__name__}; an in-place op returns None")
        return {name: inputs[name] for name in INPLACE[op]}
    if isinstance(result, torch.Tensor):
        return {"out": result}
    if not isinstance(result, (tuple, list)) or not all(isinstance(r, torch.Tensor) for r in result):
        raise OutputMismatch(f"returned {type(result).__name__}, expected a tensor or a tuple of tensors")
    names = _NAMES.get(op, ("out", "lse"))
    if len(result) > len(names):
        raise OutputMismatch(f"returned {len(result)} tensors, expected at most {len(names)}")
    return dict(zip(names, result))


def kind_of(op: str, name: str, tensor: torch.Tensor) -> str:
    """"float" (toleranced), "exact" (integers, equal element for element) or "ids_as_sets"."""
    if (op, name) in _KINDS:
        return _KINDS[(op, name)]
    return "float" if tensor.is_floating_point() else "exact"


def align_route(outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """route's ids sorted within each token, weights reordered alike: ids compare as sets,
    and each weight stays paired with its expert."""
    ids, weights = outputs["ids"].to("cpu", torch.int64), outputs["weights"].cpu()
    ids_sorted, order = ids.sort(dim=1)
    return {"weights": weights.gather(1, order), "ids": ids_sorted}
