"""What every layer is built with: the op table, the parallel group, dtype and device."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from hetero.engine.parallel import Parallel
from hetero.ops import Ops

__all__ = ["ModelContext"]


@dataclass(frozen=True)
class ModelContext:
    """Layers resolve their ops here once, at init (``ops.resolve`` asks ``supports`` then)."""

    ops: Ops
    parallel: Parallel
    dtype: torch.dtype
    device: torch.device

    def op(self, name: str, **static: Any) -> Callable:
        """The implementation of ``name`` for this model's dtype and the given static configuration."""
        static.setdefault("dtype", self.dtype)
        return self.ops.resolve(name, **static)

    def empty(self, *shape: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.empty(*shape, dtype=dtype or self.dtype, device=self.device)
