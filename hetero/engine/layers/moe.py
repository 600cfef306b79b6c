"""The routed experts of a MoE block: ``route``, then ``fused_moe`` (tensor parallel) or
``ep_dispatch`` / ``grouped_gemm`` / ``ep_combine`` (expert parallel).

Expert weights are stacked for grouped GEMM: w13 [E_local, 2I, H] (gate rows then
up rows) and w2 [E_local, H, I]. Their weight loader takes shard (expert, "gate" |
"up" | "down") and returns False for an expert another rank owns.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.linear import copy_checked
from hetero.engine.parallel import divide

__all__ = ["Routing", "FusedMoE"]

PROJECTIONS = ("gate", "up", "down")


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

    def __init__(self, ctx: ModelContext, num_experts: int, hidden: int, intermediate: int, routing: Routing,
                 *, correction_bias: bool = False):
        super().__init__()
        self.ctx, self.routing, self.num_experts = ctx, routing, num_experts
        par = ctx.parallel
        self.ep = par.expert_parallel and par.size > 1
        self.local_experts = divide(num_experts, par.size, "experts") if self.ep else num_experts
        self.expert_offset = par.rank * self.local_experts if self.ep else 0
        self.inter = intermediate if self.ep else divide(intermediate, par.size, "moe intermediate size")
        local = range(self.expert_offset, self.expert_offset + self.local_experts)
        self.w13 = nn.Parameter(ctx.empty(self.local_experts, 2 * self.inter, hidden), requires_grad=False)
        self.w2 = nn.Parameter(ctx.empty(self.local_experts, hidden, self.inter), requires_grad=False)
        self.w13.weight_loader, self.w13.shards = self.load_expert, tuple((e, p) for e in local for p in ("gate", "up"))
        self.w2.weight_loader, self.w2.shards = self.load_expert, tuple((e, "down") for e in local)
        self.correction_bias = None
        if correction_bias:
            self.correction_bias = nn.Parameter(torch.empty(num_experts, dtype=torch.float32, device=ctx.device), requires_grad=False)
            self.correction_bias.weight_loader = lambda p, t, shard=None: copy_checked(p, t.float(), "e_score_correction_bias")
            self.correction_bias.shards = (None,)
        ctx.bind_op(self, "_route", "route", scoring=routing.scoring)
        if self.ep:
            ctx.bind_op(self, "_grouped_gemm", "grouped_gemm")
            ctx.bind_op(self, "_silu_and_mul", "silu_and_mul")
            ctx.bind_op(self, "_dispatch", "ep_dispatch")
            ctx.bind_op(self, "_combine", "ep_combine")
        else:
            ctx.bind_op(self, "_fused_moe", "fused_moe", activation="silu")

    def load_expert(self, param: nn.Parameter, tensor: torch.Tensor, shard: tuple[int, str]) -> bool:
        expert, proj = shard
        if proj not in PROJECTIONS or not 0 <= expert < self.num_experts:
            raise ValueError(f"FusedMoE: shard {shard!r} is not (expert in [0, {self.num_experts}), one of {PROJECTIONS})")
        e = expert - self.expert_offset
        if not 0 <= e < self.local_experts:
            return False
        r, what = self.ctx.parallel.rank, f"FusedMoE expert {expert} {proj}"
        if proj == "down":
            cols = tensor if self.ep else tensor.narrow(1, r * self.inter, self.inter)
            copy_checked(param.data[e], cols, what)
        else:
            rows = tensor if self.ep else tensor.narrow(0, r * self.inter, self.inter)
            start = 0 if proj == "gate" else self.inter
            copy_checked(param.data[e, start:start + self.inter], rows, what)
        return True

    def _routed(self, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r = self.routing
        return self._route(router_logits, top_k=r.top_k, scoring=r.scoring, renormalize=r.renormalize, n_group=r.n_group,
                           topk_group=r.topk_group, correction_bias=self.correction_bias,
                           routed_scaling_factor=r.routed_scaling_factor)

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        if self.ep:
            return self._expert_parallel(x, router_logits)
        weights, ids = self._routed(router_logits)
        return self.ctx.parallel.all_reduce(self._fused_moe(x, self.w13, self.w2, weights, ids))

    def _expert_parallel(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        par, tokens = self.ctx.parallel, x.shape[0]
        share = -(-tokens // par.size)
        lo, hi = min(par.rank * share, tokens), min((par.rank + 1) * share, tokens)
        weights, ids = self._routed(router_logits[lo:hi])
        sent = self._dispatch(x[lo:hi], ids, weights, num_experts=self.num_experts, comm=par.comm)
        h = self._silu_and_mul(self._grouped_gemm(sent.x, self.w13, sent.group_ends))
        mine = self._combine(self._grouped_gemm(h, self.w2, sent.group_ends), sent)
        padded = torch.cat([mine, mine.new_zeros(share - (hi - lo), mine.shape[1])]) if hi - lo < share else mine
        return par.all_gather(padded, dim=0)[:tokens]
