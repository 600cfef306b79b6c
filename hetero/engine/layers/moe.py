"""The routed experts of a MoE block: ``route``, then ``fused_moe`` (tensor parallel) or
``ep_dispatch`` / ``grouped_gemm`` / ``ep_combine`` (expert parallel).

The expert weights and the expert computation belong to the layer's quantization
method (``quant_method``, picked by ``quant_config`` from the layer's checkpoint
``prefix``). Unquantized, they are stacked for grouped GEMM: w13 [E_local, 2I, H]
(gate rows then up rows) and w2 [E_local, H, I]. Every expert parameter's weight
loader takes shard (expert, "gate" | "up" | "down") and returns False for an expert
another rank owns; shard (None, "gate_up" | "down") is a checkpoint's fused tensor of
every expert (``experts.gate_up_proj [E, 2I, H]``, ``experts.down_proj [E, H, I]``,
what transformers' ``save_pretrained`` writes for families without a per-expert
conversion), loaded expert by expert.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.weights import copy_checked
from hetero.engine.parallel import divide
from hetero.engine.quant.config import QuantConfig
from hetero.errors import UsageError

__all__ = ["Routing", "FusedMoE"]

PROJECTIONS = ("gate", "up", "down")
#: the fused checkpoint tensors of all experts: (projection, the per-expert shards it holds)
FUSED = {"gate_up": ("gate", "up"), "down": ("down",)}


@dataclass(frozen=True)
class Routing:
    """The arguments of ``route`` a model family fixes (see hetero.spec.moe.route)."""

    top_k: int
    scoring: str = "softmax"
    renormalize: bool = True
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0


class FusedMoE(nn.Module):
    """E experts of intermediate size I over hidden size H; ``forward(x [T, H], router_logits [T, E]) -> [T, H]``.

    Tensor parallel: every rank holds every expert's I/R slice and the partial
    outputs are summed by an all_reduce. Expert parallel: rank r holds experts
    [r*E/R, (r+1)*E/R) whole; each rank routes its share of the (replicated) tokens,
    ships them to their experts' ranks and back, and the shares are all-gathered.
    """

    def __init__(
        self,
        ctx: ModelContext,
        num_experts: int,
        hidden: int,
        intermediate: int,
        routing: Routing,
        *,
        correction_bias: bool = False,
        activation: str = "silu",
        limit: float | None = None,
        fixed_ids: bool = False,
        prefix: str = "",
        quant_config: QuantConfig | None = None,
    ):
        super().__init__()
        self.ctx, self.prefix, self.routing, self.num_experts = ctx, prefix, routing, num_experts
        self.activation, self.limit = activation, limit
        par = ctx.parallel
        self.ep = par.expert_parallel and par.size > 1
        self.local_experts = divide(num_experts, par.size, "experts") if self.ep else num_experts
        self.expert_offset = par.rank * self.local_experts if self.ep else 0
        self.inter = intermediate if self.ep else divide(intermediate, par.size, "moe intermediate size")
        self.hidden, self.intermediate = hidden, intermediate
        ctx.bind_op(self, "_route", "route", scoring=routing.scoring, **({"fixed_ids": True} if fixed_ids else {}))
        self.quant_method = (quant_config or QuantConfig()).moe_method(prefix)
        if activation not in getattr(self.quant_method, "activations", ("silu",)):
            raise UsageError(
                f"{prefix}: experts with the {activation!r} activation are not implemented for "
                f"{type(self.quant_method).__name__} weights",
                arg="activation",
                expected=getattr(self.quant_method, "activations", ("silu",)),
                got=activation,
            )
        self.quant_method.create_weights(self, self.local_experts, hidden, self.inter)
        self.correction_bias = None
        if correction_bias:
            self.correction_bias = nn.Parameter(
                torch.empty(num_experts, dtype=torch.float32, device=ctx.device), requires_grad=False
            )
            self.correction_bias.weight_loader = lambda p, t, shard=None: copy_checked(p, t, "e_score_correction_bias")
            self.correction_bias.shards = (None,)
        if self.ep:
            ctx.bind_op(self, "_dispatch", "ep_dispatch")
            ctx.bind_op(self, "_combine", "ep_combine")

    def expert_shards(self, projections: tuple[str, ...]) -> tuple[tuple[int, str], ...]:
        """The shards of a parameter stacking ``projections`` of this rank's experts: (expert, projection)."""
        return tuple(
            (e, p) for e in range(self.expert_offset, self.expert_offset + self.local_experts) for p in projections
        )

    def load_expert(
        self, param: nn.Parameter, tensor: torch.Tensor, shard: tuple[int | None, str]
    ) -> bool | tuple[tuple[int, str], ...]:
        """Copy one expert's gate, up or down tensor into ``param`` (any expert parameter of the method);
        False for another rank's expert. Tensor parallel splits the intermediate dimension: gate and
        up rows, down columns; the method cuts the tensor and places the packed gate/up rows. Shard
        (None, "gate_up" | "down"): every expert's tensor at once; returns the shards it filled."""
        expert, proj = shard
        if expert is None and proj in FUSED:
            return self._load_fused(param, tensor, proj)
        if proj not in PROJECTIONS or not 0 <= expert < self.num_experts:
            raise ValueError(
                f"FusedMoE: shard {shard!r} is not (expert in [0, {self.num_experts}), one of {PROJECTIONS})"
            )
        e = expert - self.expert_offset
        if not 0 <= e < self.local_experts:
            return False
        method, par, what = self.quant_method, self.ctx.parallel, f"FusedMoE expert {expert} {proj}"
        if not self.ep and par.size > 1:
            tensor = method.tp_part(self, param, tensor, 1 if proj == "down" else 0, par.rank, par.size)
        dst = param.data[e]
        if proj != "down":
            start = 0 if proj == "gate" else self.inter
            dst = dst.narrow(0, *method.shard_range(self, param, 0, start, self.inter))
        copy_checked(dst, tensor, what)
        return True

    def _load_fused(self, param: nn.Parameter, tensor: torch.Tensor, proj: str) -> tuple[tuple[int, str], ...]:
        parts = FUSED[proj]
        # the orientation is checked against the config, never guessed: [E, 2I, H] and [E, H, I]
        want = (
            (self.num_experts, 2 * self.intermediate, self.hidden)
            if proj == "gate_up"
            else (self.num_experts, self.hidden, self.intermediate)
        )
        if tuple(tensor.shape) != want:
            raise ValueError(
                f"FusedMoE {self.prefix}: the fused {proj} tensor of every expert is {list(want)} "
                f"([experts, out, in] from the config), got {list(tensor.shape)}"
            )
        filled = []
        for e in range(self.expert_offset, self.expert_offset + self.local_experts):
            for part, rows in zip(parts, tensor[e].chunk(len(parts), dim=0)):
                self.load_expert(param, rows, (e, part))
                filled.append((e, part))
        return tuple(filled)

    def _routed(self, router_logits: torch.Tensor, fixed_ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        r, given = self.routing, {} if fixed_ids is None else {"fixed_ids": fixed_ids}
        return self._route(
            router_logits,
            top_k=r.top_k,
            scoring=r.scoring,
            renormalize=r.renormalize,
            n_group=r.n_group,
            topk_group=r.topk_group,
            correction_bias=self.correction_bias,
            routed_scaling_factor=r.routed_scaling_factor,
            **given,
        )

    def forward(
        self, x: torch.Tensor, router_logits: torch.Tensor, fixed_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``fixed_ids`` [T, top_k]: each token's experts given, not selected (hash routing); the layer must
        have been built with ``fixed_ids=True``."""
        if self.ep:
            return self._expert_parallel(x, router_logits, fixed_ids)
        weights, ids = self._routed(router_logits, fixed_ids)
        return self.ctx.parallel.all_reduce(self.quant_method.apply(self, x, weights, ids))

    def _expert_parallel(
        self, x: torch.Tensor, router_logits: torch.Tensor, fixed_ids: torch.Tensor | None
    ) -> torch.Tensor:
        par, tokens = self.ctx.parallel, x.shape[0]
        share = -(-tokens // par.size)
        lo, hi = min(par.rank * share, tokens), min((par.rank + 1) * share, tokens)
        weights, ids = self._routed(router_logits[lo:hi], None if fixed_ids is None else fixed_ids[lo:hi])
        sent = self._dispatch(x[lo:hi], ids, weights, num_experts=self.num_experts, comm=par.comm)
        mine = self._combine(self.quant_method.apply_grouped(self, sent.x, sent.group_ends), sent)
        padded = torch.cat([mine, mine.new_zeros(share - (hi - lo), mine.shape[1])]) if hi - lo < share else mine
        return par.all_gather(padded, dim=0)[:tokens]
