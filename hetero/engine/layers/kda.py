"""Kimi Delta Attention (KDA, Kimi-Linear's linear attention): Gated DeltaNet's recurrent core with a decay per
key channel.

Per token, with H heads of dimension D for q, k and v alike: ``q_proj`` / ``k_proj`` / ``v_proj``, each through
its own depthwise causal conv with SiLU (the checkpoint's ``q_conv1d`` / ``k_conv1d`` / ``v_conv1d``, run as one
``causal_conv1d`` over the channels q|k|v); the log-decay ``g = -exp(A_log[h]) * softplus(f_b(f_a(x)) + dt_bias)``
per key channel, [T, H, D], and ``beta = sigmoid(b_proj(x))`` [T, H] (both float32); ``gated_delta_rule`` with
that g (its per-channel mode), scale D**-0.5 and l2-normed q, k; then the gated norm
``o_norm(o) * sigmoid(g_b(g_a(x)))`` per head (``rms_norm(gate_act="sigmoid")``) and ``o_proj``. The states
are Gated DeltaNet's (``DeltaRuleMixer``): the conv's last W-1 inputs and S [H, D, D] float32.

Tensor parallel: heads split over the ranks (q/k/v, ``f_b_proj``, ``g_b_proj`` and ``b_proj`` column-parallel,
``dt_bias`` and ``A_log`` cut with them); the low-rank ``f_a_proj`` / ``g_a_proj`` are replicated, ``o_proj``
row-parallel.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.gated_deltanet import DeltaRuleMixer, GatedRMSNorm, head_vector
from hetero.engine.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from hetero.engine.layers.weights import copy_checked, join_prefix
from hetero.engine.parallel import divide
from hetero.engine.quant.config import QuantConfig
from hetero.engine.step import Step

__all__ = ["KimiDeltaAttention", "CONV_PACKED"]

#: the checkpoint's three short convolutions -> shards of the one ``conv1d.weight`` (a ``WeightMapping.packed`` entry)
CONV_PACKED = (("q_conv1d", "conv1d", "q"), ("k_conv1d", "conv1d", "k"), ("v_conv1d", "conv1d", "v"))


class _QKVConvWeight(nn.Module):
    """``weight [3 * C_local, W]``: this rank's rows of the checkpoint's ``{q,k,v}_conv1d.weight [C, 1, W]``
    (shards "q", "k", "v"), in that order."""

    def __init__(self, ctx: ModelContext, channels: int, width: int):
        super().__init__()
        par = ctx.parallel
        local = divide(channels, par.size, "conv channels")
        self.weight = nn.Parameter(ctx.empty(3 * local, width), requires_grad=False)

        def load(param: nn.Parameter, tensor: torch.Tensor, shard: Any = None) -> None:
            if shard not in ("q", "k", "v"):
                raise ValueError(f"KDA conv1d: shard {shard!r} is not one of 'q', 'k', 'v'")
            if tuple(tensor.shape) != (channels, 1, width):
                raise ValueError(
                    f"{shard}_conv1d: expected a depthwise kernel {[channels, 1, width]}, "
                    f"the checkpoint has {list(tensor.shape)}"
                )
            dst = param.data.narrow(0, "qkv".index(shard) * local, local)
            copy_checked(dst, tensor[:, 0].narrow(0, par.rank * local, local), f"{shard}_conv1d")

        self.weight.weight_loader, self.weight.shards = load, ("q", "k", "v")


class KimiDeltaAttention(DeltaRuleMixer):
    """One KDA token mixer: ``forward(hidden [T, H], step) -> [T, H]``.

    ``config`` gives ``linear_num_heads`` (H), ``linear_head_dim`` (D), ``linear_conv_kernel_dim`` (W) and
    ``rms_norm_eps`` (``o_norm``'s). Parameters under the checkpoint's names: ``q_proj``, ``k_proj``,
    ``v_proj``, ``conv1d.weight`` (packed from ``CONV_PACKED``), ``f_a_proj``, ``f_b_proj``, ``dt_bias``,
    ``A_log``, ``b_proj``, ``g_a_proj``, ``g_b_proj``, ``o_norm.weight``, ``o_proj``.
    """

    def __init__(self, ctx: ModelContext, config: Any, *, prefix: str = "", quant_config: QuantConfig | None = None):
        super().__init__()
        self.prefix = prefix
        heads, dim, hidden = config.linear_num_heads, config.linear_head_dim, config.hidden_size
        local = divide(heads, ctx.parallel.size, "linear attention heads")
        self.init_recurrent(ctx, (local, local, dim, dim), config.linear_conv_kernel_dim)
        width = heads * dim

        def at(name: str) -> dict[str, Any]:
            return dict(prefix=join_prefix(prefix, name), quant_config=quant_config)

        self.q_proj = ColumnParallelLinear(ctx, hidden, width, **at("q_proj"))
        self.k_proj = ColumnParallelLinear(ctx, hidden, width, **at("k_proj"))
        self.v_proj = ColumnParallelLinear(ctx, hidden, width, **at("v_proj"))
        self.conv1d = _QKVConvWeight(ctx, width, self.width)
        self.f_a_proj = ReplicatedLinear(ctx, hidden, dim, **at("f_a_proj"))
        self.f_b_proj = ColumnParallelLinear(ctx, dim, width, **at("f_b_proj"))
        self.dt_bias = head_vector(ctx, "dt_bias", local * dim)
        self.A_log = head_vector(ctx, "A_log", local, shape=(1, 1, heads, 1))
        self.b_proj = ColumnParallelLinear(ctx, hidden, heads, **at("b_proj"))
        self.g_a_proj = ReplicatedLinear(ctx, hidden, dim, **at("g_a_proj"))
        self.g_b_proj = ColumnParallelLinear(ctx, dim, width, **at("g_b_proj"))
        self.o_norm = GatedRMSNorm(
            ctx, dim, config.rms_norm_eps, gate_act="sigmoid", prefix=join_prefix(prefix, "o_norm")
        )
        self.o_proj = RowParallelLinear(ctx, width, hidden, **at("o_proj"))

    def gates(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(g float32 [T, H, D], beta float32 [T, H]): the per-channel log-decay and ``sigmoid(b_proj(x))``."""
        f = self.f_b_proj(self.f_a_proj(hidden)).float() + self.dt_bias
        g = -self.A_log.exp()[:, None] * F.softplus(f.view(hidden.shape[0], self.hk, self.dk))
        return g, torch.sigmoid(self.b_proj(hidden).float())

    def forward(self, hidden: torch.Tensor, step: Step) -> torch.Tensor:
        tokens = hidden.shape[0]
        mixed = torch.cat([self.q_proj(hidden), self.k_proj(hidden), self.v_proj(hidden)], dim=-1)
        g, beta = self.gates(hidden)
        gate = self.g_b_proj(self.g_a_proj(hidden)).view(tokens, self.hv, self.dv)
        out = self.o_norm(self.recur(mixed, g, beta, step), gate)
        return self.o_proj(out.reshape(tokens, self.hv * self.dv))
