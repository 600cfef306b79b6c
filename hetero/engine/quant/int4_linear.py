"""The Linear method of W4A16 checkpoints (see ``int4``): ``gemm`` on the packed int4 weight."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from hetero.engine.quant._int4_loading import Int4Loading, permuted_columns
from hetero.engine.quant._int4math import dequantize_int4, group_index
from hetero.engine.quant.base import LinearMethod, register_weight
from hetero.engine.quant.config import UnsupportedQuantization

__all__ = ["Int4LinearMethod"]


class Int4LinearMethod(Int4Loading, LinearMethod):
    """A Linear of packed int4 weights: ``gemm`` with ``b_scale`` / ``b_zero_point`` / ``group_size``."""

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int) -> None:
        par = layer.ctx.parallel
        if layer.tp_dim == 1 and par.size > 1:
            self._check_cut(layer, in_features, par.size)
        kw = dict(output_dim=0, input_dim=1)
        self._register(layer, "", (), out_features, in_features, layer.load_weight, layer.shard_ids, **kw)
        names = self.scheme.names
        if "shape" in names:
            shape = torch.empty(0, dtype=torch.int64, device=layer.ctx.device)
            register_weight(layer, names["shape"], shape, loader=self._shape_loader(layer), shards=layer.shard_ids)
        if "g_idx" in names:
            data = torch.empty(len(layer.shard_ids), in_features, dtype=torch.int32, device=layer.ctx.device)
            register_weight(layer, names["g_idx"], data, loader=self._load_g_idx(layer), shards=layer.shard_ids)
        layer.group_size = self.scheme.group(in_features)
        layer.ctx.bind_op(layer, "_gemm", "gemm", weight_dtype=torch.uint8, group_size=layer.group_size)

    def _full(self, layer, shard):
        n, k = layer.out_splits[layer.shard_ids.index(shard)], layer.in_features
        if layer.ctx.parallel.size > 1 and layer.tp_dim == 0:
            n *= layer.rank_part(shard)[1]
        elif layer.ctx.parallel.size > 1 and layer.tp_dim == 1:
            k *= layer.ctx.parallel.size
        return n, k

    def _load_g_idx(self, layer: nn.Module) -> Callable:
        def load(param: nn.Parameter, tensor: torch.Tensor, shard: Any = None) -> None:
            k = self._full(layer, shard)[1]
            if tuple(tensor.shape) != (k,) or tensor.dtype.is_floating_point:
                raise ValueError(
                    f"g_idx: expected integers of shape [{k}], the checkpoint has {tensor.dtype} {list(tensor.shape)}"
                )
            if k != layer.in_features:  # a row-parallel cut: only the canonical order can be cut
                g = self.scheme.group(k)
                if not torch.equal(tensor.long(), group_index(k, g)):
                    raise ValueError(f"{layer.prefix}: an act-order g_idx cannot be cut between ranks")
                tensor = group_index(layer.in_features, g)
            param.data[layer.shard_ids.index(shard)].copy_(tensor)

        return load

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        names, k = self.scheme.names, layer.in_features
        weight = getattr(layer, names["weight"]).detach()
        layer.run_scale = getattr(layer, names["scale"]).detach()
        layer.run_zero = self._zero_points(layer, getattr(layer, names["zero"]).detach() if "zero" in names else None)
        layer.column_order = None
        if "g_idx" in names:
            g_idx = getattr(layer, names["g_idx"]).detach()
            if not bool((g_idx == g_idx[:1]).all()):
                raise UnsupportedQuantization(
                    f"{layer.prefix}: the packed checkpoint modules ({', '.join(map(str, layer.shard_ids))}) have "
                    "different g_idx; the engine runs them as one layer with one column order"
                )
            layer.column_order = self._order(layer, g_idx[0], k, "g_idx")
        layer.run_weight = weight if layer.column_order is None else permuted_columns(weight, k, layer.column_order)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if layer.column_order is not None:
            x = x.index_select(-1, layer.column_order)
        return layer._gemm(
            x,
            layer.run_weight,
            bias=bias,
            b_scale=layer.run_scale,
            b_zero_point=layer.run_zero,
            group_size=layer.group_size,
        )

    def dense_weight(self, layer: nn.Module) -> torch.Tensor:
        k = layer.in_features
        w = dequantize_int4(layer.run_weight, layer.run_scale, layer.run_zero, k, group_size=layer.group_size)
        if layer.column_order is not None:
            w = w.index_select(-1, torch.argsort(layer.column_order))
        return w.to(layer.ctx.dtype)
