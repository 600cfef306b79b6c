"""The gated SiLU of every MLP here, through ``silu_and_mul``."""

from __future__ import annotations

import torch
from torch import nn

from hetero.engine.context import ModelContext

__all__ = ["SiluAndMul"]


class SiluAndMul(nn.Module):
    """[T, 2I] -> [T, I]: silu(x[:, :I]) * x[:, I:]."""

    def __init__(self, ctx: ModelContext):
        super().__init__()
        ctx.bind_op(self, "_op", "silu_and_mul")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._op(x)
