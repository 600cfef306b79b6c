"""The dense gated MLP of the decoder families."""

from __future__ import annotations

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.activation import SiluAndMul
from hetero.engine.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from hetero.engine.layers.weights import join_prefix
from hetero.engine.quant.config import QuantConfig

__all__ = ["GatedMLP"]


class GatedMLP(nn.Module):
    """``down(silu(gate(x)) * up(x))``: gate/up packed column-parallel, down row-parallel, biased when ``bias``."""

    def __init__(
        self,
        ctx: ModelContext,
        hidden: int,
        intermediate: int,
        *,
        bias: bool = False,
        prefix: str = "",
        quant_config: QuantConfig | None = None,
    ):
        super().__init__()
        self.prefix = prefix
        self.gate_up_proj = MergedColumnParallelLinear(
            ctx,
            hidden,
            [intermediate, intermediate],
            bias=bias,
            prefix=join_prefix(prefix, "gate_up_proj"),
            quant_config=quant_config,
        )
        self.act_fn = SiluAndMul(ctx)
        self.down_proj = RowParallelLinear(
            ctx, intermediate, hidden, bias=bias, prefix=join_prefix(prefix, "down_proj"), quant_config=quant_config
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))
