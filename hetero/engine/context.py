"""What every layer is built with: the op table, the parallel group, dtype and device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from hetero.engine.parallel import Parallel
from hetero.engine.pipeline import Stage
from hetero.ops import Ops

__all__ = ["ModelContext", "OP_SLOTS", "op_slots"]

#: the attribute of a layer listing its op slots: {attribute name: op name}
OP_SLOTS = "op_slots"


def op_slots(layer: nn.Module) -> dict[str, str]:
    """The op slots ``layer`` declared through ``ModelContext.bind_op``: {attribute: op} (empty if none)."""
    return vars(layer).get(OP_SLOTS, {})


@dataclass(frozen=True)
class ModelContext:
    """Layers resolve their ops here once, at init (``ops.resolve`` asks ``supports`` then). ``stage``: the
    pipeline stage the model is built for (None: the whole model)."""

    ops: Ops
    parallel: Parallel
    dtype: torch.dtype
    device: torch.device
    stage: Stage | None = None

    def owns(self, layer: int | str) -> bool:
        """Whether this process builds decoder layer ``layer``, or "first" (the embedding) / "last" (final
        norm and head): everything without pipeline parallelism."""
        s = self.stage
        if s is None:
            return True
        return s.first if layer == "first" else s.last if layer == "last" else s.owns(layer)

    def op(self, name: str, **static: Any) -> Callable:
        """The implementation of ``name`` for this model's dtype and the given static configuration."""
        static.setdefault("dtype", self.dtype)
        return self.ops.resolve(name, **static)

    def bind_op(self, layer: nn.Module, attr: str, name: str, **static: Any) -> Callable:
        """Resolve ``name`` (as ``op``), store it as ``layer.<attr>`` and declare the slot.

        Every op a layer calls goes through a slot declared here, so the op-call seam
        (``hetero.engine.instrument``) finds them all by name, not by guessing. The
        layer keeps calling the plain resolved callable: nothing is added per call.
        """
        fn = self.op(name, **static)
        setattr(layer, attr, fn)
        vars(layer).setdefault(OP_SLOTS, {})[attr] = name
        return fn

    def empty(self, *shape: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.empty(*shape, dtype=dtype or self.dtype, device=self.device)
