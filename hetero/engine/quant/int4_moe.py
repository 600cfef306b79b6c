"""The FusedMoE method of W4A16 checkpoints (see ``int4``): stacked packed int4 experts.

``w13`` parts [E, 2I, ...] (gate rows, then up rows) and ``w2`` parts [E, H, ...], named ``w13_<suffix>`` /
``w2_<suffix>`` after the checkpoint's (``w13_weight_packed``, ``w2_qzeros``, ...). Tensor parallel: one
``fused_moe`` with the int4 options (each rank holds every expert's I/R slice: w2's columns are cut, at
group boundaries); expert parallel: ``grouped_gemm``, ``silu_and_mul``, ``grouped_gemm``.

GPTQ act-order experts permute their input columns each their own way, which one ``fused_moe`` call over a
shared x cannot express: they run the grouped path everywhere (tensor parallel size 1: ``moe_permute`` /
``moe_unpermute`` around it), each row's columns gathered in its expert's order first (torch glue).
Per-channel scales take one group size for both projections: max(H, I) spans either's columns.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from hetero.engine.quant._int4_loading import Int4Loading, permuted_columns
from hetero.engine.quant.base import MoEMethod, clamp_gate_up, register_weight
from hetero.engine.quant.config import UnsupportedQuantization

__all__ = ["Int4MoEMethod"]

_PROJ = {"gate": ("w13", 0), "up": ("w13", 1), "down": ("w2", 0)}


def _gather_rows(x: torch.Tensor, orders: torch.Tensor | None, group_ends: torch.Tensor) -> torch.Tensor:
    """Each row of ``x`` (grouped by expert, ``group_ends``) with its columns in its expert's order."""
    if orders is None:
        return x
    rows = torch.arange(x.shape[0], device=x.device)
    expert = torch.searchsorted(group_ends.long(), rows, right=True).clamp(max=orders.shape[0] - 1)
    return x.gather(1, orders[expert])


class Int4MoEMethod(Int4Loading, MoEMethod):
    """Stacked int4 experts through ``fused_moe`` (or the grouped GEMMs) with scales, zero points and group size."""

    activations = ("silu", "swiglu_clamp")

    def create_weights(self, layer: nn.Module, num_experts: int, hidden: int, intermediate: int) -> None:
        ctx, names = layer.ctx, self.scheme.names
        if not layer.ep and ctx.parallel.size > 1:
            self._check_cut(layer, intermediate, ctx.parallel.size)
        shards = {w: layer.expert_shards(p) for w, p in (("w13", ("gate", "up")), ("w2", ("down",)))}
        self._register(layer, "w13_", (num_experts,), 2 * intermediate, hidden, layer.load_expert, shards["w13"])
        self._register(layer, "w2_", (num_experts,), hidden, intermediate, layer.load_expert, shards["w2"])
        for w, rows, k in (("w13", 2, hidden), ("w2", 1, intermediate)):
            if "shape" in names:
                empty = torch.empty(0, dtype=torch.int64, device=ctx.device)
                register_weight(
                    layer, f"{w}_{names['shape']}", empty, loader=self._shape_loader(layer), shards=shards[w]
                )
            if "g_idx" in names:
                data = ctx.empty(num_experts, rows, k, dtype=torch.int32)
                register_weight(
                    layer, f"{w}_{names['g_idx']}", data, loader=self._g_idx_loader(layer), shards=shards[w]
                )
        layer.group_size = self.scheme.group_size or max(hidden, intermediate)
        static = dict(weight_dtype=torch.uint8, group_size=layer.group_size)
        layer.int4_grouped = layer.ep or self.scheme.desc_act
        if layer.int4_grouped:
            ctx.bind_op(layer, "_grouped_gemm", "grouped_gemm", **static)
            ctx.bind_op(layer, "_silu_and_mul", "silu_and_mul")
            if not layer.ep:
                ctx.bind_op(layer, "_moe_permute", "moe_permute")
                ctx.bind_op(layer, "_moe_unpermute", "moe_unpermute")
        else:
            ctx.bind_op(layer, "_fused_moe", "fused_moe", activation=layer.activation, **static)

    def _local(self, layer, shard):
        super()._local(layer, shard)
        return 0 <= shard[0] - layer.expert_offset < layer.local_experts

    def _full(self, layer, shard):
        return (layer.hidden, layer.intermediate) if shard[1] == "down" else (layer.intermediate, layer.hidden)

    def _g_idx_loader(self, layer: nn.Module) -> Callable:
        def load(param: nn.Parameter, tensor: torch.Tensor, shard: Any):
            if not self._local(layer, shard):
                return False
            k = self._full(layer, shard)[1]
            if tuple(tensor.shape) != (k,) or tensor.dtype.is_floating_point:
                raise ValueError(
                    f"g_idx: expected integers of shape [{k}], the checkpoint has {tensor.dtype} {list(tensor.shape)}"
                )
            param.data[shard[0] - layer.expert_offset, _PROJ[shard[1]][1]].copy_(tensor)
            return True

        return load

    def _orders(self, layer: nn.Module, w: str, k: int) -> torch.Tensor | None:
        """[E, k] column orders of ``w``'s experts (None: every expert's groups already contiguous)."""
        g_idx = getattr(layer, f"{w}_{self.scheme.names['g_idx']}").detach()
        if not bool((g_idx == g_idx[:, :1]).all()):
            raise UnsupportedQuantization(f"{layer.prefix}: an expert's gate_proj and up_proj have different g_idx")
        orders = [
            self._order(layer, g_idx[e, 0], k, f"expert {e + layer.expert_offset}'s {w} g_idx")
            for e in range(len(g_idx))
        ]
        if all(o is None for o in orders):
            return None
        arange = torch.arange(k, device=g_idx.device)
        return torch.stack([arange if o is None else o for o in orders])

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        names = self.scheme.names
        for w, k in (("w13", layer.hidden), ("w2", layer.inter)):
            weight = getattr(layer, f"{w}_{names['weight']}").detach()
            setattr(layer, f"run_{w}_scale", getattr(layer, f"{w}_{names['scale']}").detach())
            zero = getattr(layer, f"{w}_{names['zero']}").detach() if "zero" in names else None
            setattr(layer, f"run_{w}_zero", self._zero_points(layer, zero))
            order = self._orders(layer, w, k) if "g_idx" in names else None
            setattr(layer, f"{w}_order", order)
            setattr(layer, f"run_{w}", weight if order is None else permuted_columns(weight, k, order))

    def _int4(self, layer: nn.Module, w: str) -> dict[str, Any]:
        return dict(b_scale=getattr(layer, f"run_{w}_scale"), b_zero_point=getattr(layer, f"run_{w}_zero"))

    def apply(self, layer: nn.Module, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        if layer.int4_grouped:
            rows, group_ends, perm = layer._moe_permute(x, ids, layer.num_experts)
            return layer._moe_unpermute(self.apply_grouped(layer, rows, group_ends), perm, weights)
        clamp = {} if layer.activation == "silu" else dict(activation=layer.activation, limit=layer.limit)
        return layer._fused_moe(
            x,
            layer.run_w13,
            layer.run_w2,
            weights,
            ids,
            w13_scale=layer.run_w13_scale,
            w2_scale=layer.run_w2_scale,
            w13_zero_point=layer.run_w13_zero,
            w2_zero_point=layer.run_w2_zero,
            group_size=layer.group_size,
            **clamp,
        )

    def apply_grouped(self, layer: nn.Module, x: torch.Tensor, group_ends: torch.Tensor) -> torch.Tensor:
        g = layer.group_size
        x = _gather_rows(x, layer.w13_order, group_ends)
        gate_up = layer._grouped_gemm(x, layer.run_w13, group_ends, group_size=g, **self._int4(layer, "w13"))
        if layer.activation == "swiglu_clamp":
            gate_up = clamp_gate_up(gate_up, layer.limit)
        h = _gather_rows(layer._silu_and_mul(gate_up), layer.w2_order, group_ends)
        return layer._grouped_gemm(h, layer.run_w2, group_ends, group_size=g, **self._int4(layer, "w2"))
