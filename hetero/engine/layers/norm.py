"""RMSNorm through ``rms_norm``, with the fused residual add."""

from __future__ import annotations

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.weights import copy_checked

__all__ = ["RMSNorm"]


class RMSNorm(nn.Module):
    """``norm(x)``, or with ``residual``: ``(norm(x + residual), x + residual)``.

    Works on any leading shape (per-head q/k norms pass [T, H, D]). ``prefix`` is the
    checkpoint name ("model.layers.0.input_layernorm"). ``options`` are rms_norm's keyword
    options this norm always sets (``weight_offset=1.0`` for zero-centred weights); they are
    also the static configuration the op is resolved with, so a backend that lacks one
    declines and the reference serves it.
    """

    def __init__(self, ctx: ModelContext, hidden: int, eps: float, *, prefix: str = "", **options):
        super().__init__()
        self.eps, self.prefix, self.options = float(eps), prefix, options
        self.weight = nn.Parameter(ctx.empty(hidden), requires_grad=False)
        self.weight.weight_loader = lambda p, t, shard=None: copy_checked(p, t, type(self).__name__)
        self.weight.shards = (None,)
        ctx.bind_op(self, "_rms_norm", "rms_norm", **options)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return self._rms_norm(x, self.weight, self.eps, **self.options)
        return self._rms_norm(x, self.weight, self.eps, residual=residual, **self.options)
