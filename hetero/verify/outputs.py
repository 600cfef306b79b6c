"""What each op produces, by name, and how each output is compared: read from the op's spec
(``OpSpec.returns``, ``OpSpec.mutates``), never from a table of this package."""

from __future__ import annotations

from typing import Any

import torch

from hetero.spec import OPS, OpSpec

__all__ = ["OutputMismatch", "spec_of", "outputs_of", "kind_of", "untouched_inputs", "comparable", "REPORT_KINDS"]

#: The name each comparison has in reports and verdict messages (kept from before the spec declared them).
REPORT_KINDS = {"tolerance": "float", "exact": "exact", "row_set": "ids_as_sets"}


class OutputMismatch(Exception):
    """The op returned the wrong number or kind of results."""


def spec_of(op: str) -> OpSpec:
    """The spec of ``op``: the one place this package reads op metadata from."""
    return OPS[op]


def _arguments(spec: OpSpec, inputs: dict[str, Any]) -> dict[str, Any]:
    bound = spec.signature.bind_partial(**{k: v for k, v in inputs.items() if k in spec.signature.parameters})
    bound.apply_defaults()
    return dict(bound.arguments)


def _returned(spec: OpSpec, inputs: dict[str, Any], result: Any) -> dict[str, Any]:
    names = [o.name for o in spec.returns if o.present(_arguments(spec, inputs))]
    if not spec.returns:
        if result is not None:
            raise OutputMismatch(f"returned {type(result).__name__}; an in-place op returns None")
        return {}
    if isinstance(result, torch.Tensor):
        return {names[0] if names else spec.returns[0].name: result}
    if not isinstance(result, (tuple, list)) or not all(isinstance(r, torch.Tensor) for r in result):
        raise OutputMismatch(f"returned {type(result).__name__}, expected a tensor or a tuple of tensors")
    if len(result) > len(names):
        raise OutputMismatch(f"returned {len(result)} tensors, expected at most {len(names)}")
    return dict(zip(names, result))


def outputs_of(op: str, inputs: dict[str, Any], result: Any) -> dict[str, torch.Tensor]:
    """The named outputs of one call: what it returned, then the arguments it mutated (those given)."""
    spec = spec_of(op)
    outputs = _returned(spec, inputs, result)
    for m in spec.mutates:
        if m.name not in outputs and isinstance(inputs.get(m.name), torch.Tensor):
            outputs[m.name] = inputs[m.name]
    return outputs


def untouched_inputs(op: str, inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """CPU copies of the tensor arguments the op must leave as they are (all but those it mutates)."""
    mutated = spec_of(op).mutated_names
    return {k: v.detach().cpu().clone() for k, v in inputs.items() if isinstance(v, torch.Tensor) and k not in mutated}


def kind_of(op: str, name: str, tensor: torch.Tensor) -> str:
    """How output ``name`` is compared, as reports name it: "float" (toleranced), "exact" or "ids_as_sets".

    An output the spec does not declare (a malformed result) is judged by its dtype.
    """
    try:
        return REPORT_KINDS[spec_of(op).output(name).compare]
    except KeyError:
        return "float" if tensor.is_floating_point() else "exact"


def comparable(op: str, outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU copies of the outputs, each ``row_set`` output sorted within its rows and the
    outputs it reorders permuted alike, so they compare element for element."""
    outs = {k: v.detach().cpu() for k, v in outputs.items()}
    for o in spec_of(op).outputs:
        if o.compare != "row_set" or o.name not in outs:
            continue
        ranked, order = outs[o.name].to(torch.int64).sort(dim=-1)
        outs[o.name] = ranked
        for other in o.reorders:
            if other in outs and outs[other].shape == order.shape:
                outs[other] = outs[other].gather(-1, order)
    return outs
