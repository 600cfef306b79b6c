"""DeepSeek-V4's MoE block: ``route`` with ``sqrtsoftplus`` scores and a selection-only bias, or, in a
``mlp_layer_types`` "hash_moe" layer, with the experts a token-id table gives (``route(fixed_ids=)``, the weights
still the router's scores of those experts); experts and the shared expert clamp SwiGLU at ``swiglu_limit``
(transformers' ``DeepseekV4SparseMoeBlock``, ``DeepseekV4TopKRouter``, ``DeepseekV4HashRouter``).

The router ``gate`` is a model-dtype Linear, as transformers' ``MixtralTopKRouter`` is; ``gate.tid2eid`` (int64
[vocab, top_k]) is loaded from the checkpoint. Tensor and expert parallelism are ``FusedMoE``'s; the table is
replicated.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.activation import SiluAndMul
from hetero.engine.layers.linear import MergedColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from hetero.engine.layers.moe import FusedMoE, Routing
from hetero.engine.layers.weights import copy_checked, join_prefix
from hetero.engine.quant.base import clamp_gate_up
from hetero.engine.quant.config import QuantConfig

__all__ = ["ClampedMLP", "DeepseekV4MoE", "MLP_LAYER_TYPES"]

MLP_LAYER_TYPES = ("hash_moe", "moe")


class ClampedMLP(nn.Module):
    """The shared expert: ``down(silu(min(gate, l)) * clamp(up, -l, l))``, gate/up packed column-parallel."""

    def __init__(
        self,
        ctx: ModelContext,
        hidden: int,
        intermediate: int,
        limit: float,
        *,
        prefix: str = "",
        quant_config: QuantConfig | None = None,
    ):
        super().__init__()
        self.prefix, self.limit = prefix, float(limit)
        at = dict(quant_config=quant_config)
        self.gate_up_proj = MergedColumnParallelLinear(
            ctx, hidden, [intermediate, intermediate], prefix=join_prefix(prefix, "gate_up_proj"), **at
        )
        self.act_fn = SiluAndMul(ctx)
        self.down_proj = RowParallelLinear(ctx, intermediate, hidden, prefix=join_prefix(prefix, "down_proj"), **at)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(clamp_gate_up(self.gate_up_proj(x), self.limit)))


class DeepseekV4MoE(nn.Module):
    """``forward(x [T, H], input_ids [T]) -> [T, H]``: routed experts (scored, or hash-routed by token id) plus the
    shared expert."""

    def __init__(
        self,
        ctx: ModelContext,
        hf_config: Any,
        layer_idx: int,
        *,
        prefix: str = "",
        quant_config: QuantConfig | None = None,
    ):
        super().__init__()
        c, self.prefix = hf_config, prefix
        kind = c.mlp_layer_types[layer_idx]
        if kind not in MLP_LAYER_TYPES:
            raise ValueError(f"{prefix}: mlp_layer_types[{layer_idx}] = {kind!r}, expected one of {MLP_LAYER_TYPES}")
        self.hashed = kind == "hash_moe"
        limit = float(c.swiglu_limit)
        routing = Routing(
            top_k=int(c.num_experts_per_tok),
            scoring=str(c.scoring_func),
            renormalize=bool(c.norm_topk_prob),
            routed_scaling_factor=float(c.routed_scaling_factor),
        )
        self.gate = ReplicatedLinear(
            ctx, c.hidden_size, c.n_routed_experts, prefix=join_prefix(prefix, "gate"), quant_config=quant_config
        )
        self.experts = FusedMoE(
            ctx,
            c.n_routed_experts,
            c.hidden_size,
            c.moe_intermediate_size,
            routing,
            correction_bias=not self.hashed,
            activation="swiglu_clamp",
            limit=limit,
            fixed_ids=self.hashed,
            prefix=join_prefix(prefix, "experts"),
            quant_config=quant_config,
        )
        if self.hashed:
            table = nn.Parameter(
                torch.empty(c.vocab_size, routing.top_k, dtype=torch.int64, device=ctx.device), requires_grad=False
            )
            what = join_prefix(prefix, "gate.tid2eid")
            table.weight_loader = lambda p, t, shard=None: copy_checked(p, t, what)
            table.shards = (None,)
            self.gate.tid2eid = table
        else:
            self.gate.e_score_correction_bias = self.experts.correction_bias
        self.shared_experts = ClampedMLP(
            ctx,
            c.hidden_size,
            c.moe_intermediate_size * int(c.n_shared_experts),
            limit,
            prefix=join_prefix(prefix, "shared_experts"),
            quant_config=quant_config,
        )

    def forward(self, x: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        logits = self.gate(x)
        fixed = self.gate.tid2eid[input_ids] if self.hashed else None
        return self.experts(x, logits, fixed) + self.shared_experts(x)
