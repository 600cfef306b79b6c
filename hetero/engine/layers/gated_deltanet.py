"""Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5): ``causal_conv1d`` + ``gated_delta_rule``.

Per token: one projection gives q, k, v (the conv channels), z (the output gate), b and a
(the per-value-head gates); q|k|v go through a depthwise causal conv with SiLU, then the
gated delta rule with ``beta = sigmoid(b)`` and ``g = -exp(A_log) * softplus(a + dt_bias)``
(both computed here in float32), then a gated RMSNorm per value head (``norm(o) * silu(z)``)
and ``out_proj``. Two states per sequence: the conv's last W-1 inputs (model dtype) and the
delta rule's S [HV, K, V] (float32); both are ``init="flag"``: the ops read
``Step.has_initial_state`` instead of the runtime zeroing a slot.

Tensor parallel: key heads and value heads are split over the ranks (value head i belongs
with key head i // (HV / H), so a rank's value heads are those of its key heads); the conv
channels follow as q|k|v of the local heads, and ``out_proj`` is row-parallel.

``DeltaRuleMixer`` is the recurrent core (conv, delta rule, states) Kimi's KDA (``layers/kda.py``) shares.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.delta_rule import DeltaRuleMixer
from hetero.engine.layers.linear import Linear, RowParallelLinear
from hetero.engine.layers.weights import copy_checked, join_prefix
from hetero.engine.parallel import divide
from hetero.engine.quant.config import QuantConfig
from hetero.engine.step import Step

__all__ = ["DeltaRuleMixer", "GatedDeltaNet", "GatedDeltaNetInProj", "GatedRMSNorm", "LAYOUTS", "head_vector"]

#: checkpoint layout -> the shards of ``in_proj``: "split" is Qwen3.5's in_proj_qkv / _z / _b / _a,
#: "interleaved" Qwen3-Next's in_proj_qkvz / in_proj_ba grouped by key head
LAYOUTS = {"split": ("qkv", "z", "b", "a"), "interleaved": ("qkvz", "ba")}


def _check_rows(tensor: torch.Tensor, sections: list[int]) -> None:
    if tensor.shape[0] != sum(sections):
        raise ValueError(
            f"expected {sum(sections)} rows ({' + '.join(map(str, sections))}), the checkpoint has {tensor.shape[0]}"
        )


def _rank_rows(tensor: torch.Tensor, sections: list[int], rank: int, size: int) -> list[torch.Tensor]:
    """This rank's equal share of each consecutive section of ``tensor``'s rows (q|k|v packed whole)."""
    _check_rows(tensor, sections)
    parts, start = [], 0
    for n in sections:
        share = divide(n, size, "rows")
        parts.append(tensor.narrow(0, start + rank * share, share))
        start += n
    return parts


class GatedDeltaNetInProj(Linear):
    """q, k, v, z, b, a of a Gated DeltaNet layer in one column-parallel weight, whatever the layout.

    Local rows are ``[q | k | v | z | b | a]`` of this rank's ``hk`` key and ``hv`` value heads
    (q, k: hk*dk; v, z: hv*dv; b, a: hv). Checkpoint layouts (``LAYOUTS``):

    - "split": ``in_proj_qkv`` holds q|k|v of all heads, each section cut per rank;
      ``in_proj_z`` / ``_b`` / ``_a`` are cut as plain column-parallel tensors;
    - "interleaved": ``in_proj_qkvz`` is grouped by key head, ``[q (dk) | k (dk) | v (r*dv) |
      z (r*dv)]`` per head, and ``in_proj_ba`` ``[b (r) | a (r)]`` (r = hv / hk). A rank's key
      heads are one contiguous block of rows, reordered here into the local layout.

    Rows are reordered per element: a block-scaled format would need its own method for this.
    """

    tp_dim = 0

    def __init__(
        self,
        ctx: ModelContext,
        hidden: int,
        heads: tuple[int, int, int, int],
        layout: str,
        *,
        prefix: str = "",
        quant_config: QuantConfig | None = None,
    ):
        if layout not in LAYOUTS:
            raise ValueError(f"GatedDeltaNetInProj: layout must be one of {sorted(LAYOUTS)}, got {layout!r}")
        self.hk, self.hv, self.dk, self.dv = heads
        self.layout = layout
        q, v = self.hk * self.dk, self.hv * self.dv
        self.offsets = {"q": 0, "k": q, "v": 2 * q, "z": 2 * q + v, "b": 2 * q + 2 * v, "a": 2 * q + 2 * v + self.hv}
        sizes = {"qkv": 2 * q + v, "z": v, "b": self.hv, "a": self.hv, "qkvz": 2 * q + 2 * v, "ba": 2 * self.hv}
        shards = LAYOUTS[layout]
        super().__init__(
            ctx, hidden, [sizes[s] for s in shards], shard_ids=list(shards), prefix=prefix, quant_config=quant_config
        )

    @property
    def split_sizes(self) -> list[int]:
        """The widths of q|k|v (the conv channels), z, b and a in the output."""
        return [2 * self.hk * self.dk + self.hv * self.dv, self.hv * self.dv, self.hv, self.hv]

    def _pieces(self, param: nn.Parameter, tensor: torch.Tensor, shard: str) -> list[tuple[str, torch.Tensor]]:
        """(local section, this rank's rows of it) for checkpoint ``tensor`` of ``shard``."""
        par, method = self.ctx.parallel, self.quant_method
        _check_rows(tensor, [self.out_splits[self.shard_ids.index(shard)] * par.size])
        cut = lambda t: method.tp_part(self, param, t, 0, par.rank, par.size)  # noqa: E731
        if shard == "qkv":
            sections = [self.hk * self.dk * par.size] * 2 + [self.hv * self.dv * par.size]
            return list(zip("qkv", (cut(t) for t in tensor.split(sections))))
        if shard in ("z", "b", "a"):
            return [(shard, cut(tensor))]
        r = self.hv // self.hk
        names, widths = ("qkvz", [self.dk, self.dk, r * self.dv, r * self.dv]) if shard == "qkvz" else ("ba", [r, r])
        mine = cut(tensor).reshape(self.hk, sum(widths), *tensor.shape[1:])  # [local key heads, rows per head, ...]
        return [(n, t.reshape(-1, *tensor.shape[1:])) for n, t in zip(names, mine.split(widths, dim=1))]

    def load_weight(self, param: nn.Parameter, tensor: torch.Tensor, shard: Any = None) -> None:
        if shard not in self.shard_ids or getattr(param, "output_dim", None) != 0:
            return super().load_weight(param, tensor, shard)
        what = f"{type(self).__name__} shard {shard!r}"
        for section, rows in self._pieces(param, tensor, shard):
            start = self.offsets[section]
            dst = param.data.narrow(0, *self.quant_method.shard_range(self, param, 0, start, rows.shape[0]))
            copy_checked(dst, rows, f"{what} ({section})")


class GatedRMSNorm(nn.Module):
    """``rms_norm(x) * weight * act(gate)`` over the last dim (one value head): x, gate [T, H, D]; ``gate_act``
    "silu" (Gated DeltaNet) or "sigmoid" (KDA)."""

    def __init__(self, ctx: ModelContext, dim: int, eps: float, *, gate_act: str = "silu", prefix: str = ""):
        super().__init__()
        self.eps, self.prefix, self.gate_act = float(eps), prefix, gate_act
        self.weight = nn.Parameter(ctx.empty(dim), requires_grad=False)
        self.weight.weight_loader = lambda p, t, shard=None: copy_checked(p, t, "GatedRMSNorm")
        self.weight.shards = (None,)
        ctx.bind_op(self, "_rms_norm", "rms_norm", gate=True, gate_act=gate_act)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return self._rms_norm(x, self.weight, self.eps, gate=gate, gate_act=self.gate_act)


def head_vector(ctx: ModelContext, what: str, count: int, shape: tuple[int, ...] | None = None) -> nn.Parameter:
    """A float32 per-head vector (A_log, dt_bias): this rank's ``count`` entries of the checkpoint's, read flat
    from its ``shape`` (default ``(count * ranks,)``; KDA's A_log is [1, 1, H, 1]).

    float32 because the gates are computed in float32 (a bfloat16 checkpoint value casts exactly)."""
    rank, size = ctx.parallel.rank, ctx.parallel.size
    shape = shape or (count * size,)

    def load(param: nn.Parameter, tensor: torch.Tensor, shard: Any = None) -> None:
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{what}: expected shape {shape}, the checkpoint has {tuple(tensor.shape)}")
        copy_checked(param, tensor.reshape(-1).narrow(0, rank * count, count), what)

    param = nn.Parameter(ctx.empty(count, dtype=torch.float32), requires_grad=False)
    param.weight_loader, param.shards = load, (None,)
    return param


class _ConvWeight(nn.Module):
    """``weight [C_local, W]``, loaded from the checkpoint's ``conv1d.weight [C, 1, W]``: this rank's rows
    of each of q, k and v (the conv runs over the local q|k|v channels)."""

    def __init__(self, ctx: ModelContext, sections: list[int], width: int):
        super().__init__()
        par = ctx.parallel
        local = [divide(n, par.size, "conv channels") for n in sections]
        self.weight = nn.Parameter(ctx.empty(sum(local), width), requires_grad=False)

        def load(param: nn.Parameter, tensor: torch.Tensor, shard: Any = None) -> None:
            if tensor.ndim != 3 or tensor.shape[1] != 1:
                raise ValueError(
                    f"conv1d: expected a depthwise kernel [C, 1, W], the checkpoint has {tuple(tensor.shape)}"
                )
            copy_checked(param, torch.cat(_rank_rows(tensor[:, 0], sections, par.rank, par.size)), "conv1d")

        self.weight.weight_loader, self.weight.shards = load, (None,)


class GatedDeltaNet(DeltaRuleMixer):
    """One Gated DeltaNet token mixer: ``forward(hidden [T, H], step) -> [T, H]``.

    ``config`` gives ``linear_num_key_heads`` / ``linear_num_value_heads`` (H, HV),
    ``linear_key_head_dim`` / ``linear_value_head_dim`` (K, V), ``linear_conv_kernel_dim`` (W)
    and ``rms_norm_eps``; ``layout`` is the checkpoint's projection layout (``LAYOUTS``).
    Parameters: ``in_proj`` (packed, see GatedDeltaNetInProj), ``conv1d.weight``, ``A_log``,
    ``dt_bias``, ``norm.weight``, ``out_proj``.
    """

    def __init__(
        self, ctx: ModelContext, config: Any, layout: str, *, prefix: str = "", quant_config: QuantConfig | None = None
    ):
        super().__init__()
        self.prefix, size = prefix, ctx.parallel.size
        hk_total, hv_total = config.linear_num_key_heads, config.linear_num_value_heads
        divide(hv_total, hk_total, "value heads per key head")
        hk = divide(hk_total, size, "linear attention key heads")
        hv = divide(hv_total, size, "linear attention value heads")
        heads = (hk, hv, config.linear_key_head_dim, config.linear_value_head_dim)
        self.init_recurrent(ctx, heads, config.linear_conv_kernel_dim)
        self.in_proj = GatedDeltaNetInProj(
            ctx,
            config.hidden_size,
            (self.hk, self.hv, self.dk, self.dv),
            layout,
            prefix=join_prefix(prefix, "in_proj"),
            quant_config=quant_config,
        )
        self.conv1d = _ConvWeight(ctx, [hk_total * self.dk] * 2 + [hv_total * self.dv], self.width)
        self.A_log = head_vector(ctx, "A_log", self.hv)
        self.dt_bias = head_vector(ctx, "dt_bias", self.hv)
        self.norm = GatedRMSNorm(ctx, self.dv, config.rms_norm_eps, prefix=join_prefix(prefix, "norm"))
        self.out_proj = RowParallelLinear(
            ctx,
            hv_total * self.dv,
            config.hidden_size,
            prefix=join_prefix(prefix, "out_proj"),
            quant_config=quant_config,
        )

    def gates(self, b: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(g, beta) float32 [T, HV]: the log-decay ``-exp(A_log) * softplus(a + dt_bias)`` and ``sigmoid(b)``."""
        g = -self.A_log.exp() * F.softplus(a.float() + self.dt_bias)
        return g, torch.sigmoid(b.float())

    def forward(self, hidden: torch.Tensor, step: Step) -> torch.Tensor:
        tokens = hidden.shape[0]
        mixed, z, b, a = self.in_proj(hidden).split(self.in_proj.split_sizes, dim=-1)
        g, beta = self.gates(b, a)
        out = self.norm(self.recur(mixed, g, beta, step), z.reshape(tokens, self.hv, self.dv))
        return self.out_proj(out.reshape(tokens, self.hv * self.dv))
