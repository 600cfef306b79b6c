"""Linear layers split for tensor parallelism; their weights and product belong to a quantization method.

Every parameter of the engine carries two attributes the loader relies on:
``weight_loader(param, tensor, shard)`` copies one checkpoint tensor into it (this
rank's slice of it, at the offset of ``shard`` for packed parameters: q/k/v in
qkv_proj, 0/1 for gate/up in gate_up_proj), and ``shards``, the tuple of shard
ids the parameter needs ((None,) when it is not packed). The loader
(``hetero.engine.loader``) records which (parameter, shard) pairs it filled.

A Linear's method (``quant_method``, picked by ``quant_config`` from the layer's
checkpoint ``prefix``; unquantized by default: ``weight`` and ``gemm``) creates the
weight parameters, cuts checkpoint tensors for them, fixes them up after loading and
computes the product. The layer owns the bias and the parallel layout: which rows
each shard occupies and which part of a checkpoint tensor is this rank's.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.layers.weights import copy_checked
from hetero.engine.parallel import divide
from hetero.engine.quant.config import QuantConfig

__all__ = [
    "Linear",
    "ColumnParallelLinear",
    "MergedColumnParallelLinear",
    "QKVParallelLinear",
    "RowParallelLinear",
    "ReplicatedLinear",
    "copy_checked",
]

#: tp_dim -> the parameter attribute naming the dimension it splits
_SPLIT_ATTR = {0: "output_dim", 1: "input_dim"}


class Linear(nn.Module):
    """y = x @ W.T (+ b), W [out, in] as in nn.Linear, computed by the layer's quantization method.

    ``out_splits`` lists the sizes of the logical outputs packed into W (one shard
    each) on this rank; ``tp_dim`` is the dimension split over ranks (0: columns,
    1: rows, None: replicated). ``prefix`` is the layer's checkpoint name
    ("model.layers.3.self_attn.qkv_proj"); ``quant_config`` picks its method from it.
    """

    tp_dim: int | None = None

    def __init__(
        self,
        ctx: ModelContext,
        in_features: int,
        out_splits: Sequence[int],
        *,
        bias: bool = False,
        shard_ids: Sequence[Any] | None = None,
        prefix: str = "",
        quant_config: QuantConfig | None = None,
    ):
        super().__init__()
        self.ctx, self.prefix = ctx, prefix
        self.in_features = in_features
        self.out_splits = list(out_splits)
        self.shard_ids = list(shard_ids) if shard_ids is not None else [None]
        self.quant_method = (quant_config or QuantConfig()).linear_method(prefix)
        self.quant_method.create_weights(self, in_features, sum(self.out_splits))
        self.bias = None
        if bias:
            self.bias = nn.Parameter(ctx.empty(sum(out_splits)), requires_grad=False)
            self.bias.weight_loader, self.bias.shards = self.load_weight, tuple(self.shard_ids)
            self.bias.output_dim = 0

    def shard_range(self, shard: Any) -> tuple[int, int]:
        """Rows of the local weight that hold ``shard``."""
        i = self.shard_ids.index(shard)
        start = sum(self.out_splits[:i])
        return start, start + self.out_splits[i]

    def rank_part(self, shard: Any) -> tuple[int, int]:
        """(index, count): this rank loads part ``index`` of ``count`` equal parts of ``shard``'s checkpoint tensor."""
        return self.ctx.parallel.rank, self.ctx.parallel.size

    def split_dim(self, param: nn.Parameter) -> int | None:
        """The dimension of ``param`` split over ranks, None when every rank loads it whole
        (a replicated layer, or a row-parallel bias: added once, after the all-reduce)."""
        attr = _SPLIT_ATTR.get(self.tp_dim)
        return getattr(param, attr, None) if attr else None

    def load_weight(self, param: nn.Parameter, tensor: torch.Tensor, shard: Any = None) -> None:
        """Copy this rank's part of checkpoint ``tensor`` into ``shard``'s rows of ``param`` (any of the
        method's parameters)."""
        what = f"{type(self).__name__} shard {shard!r}" if shard is not None else type(self).__name__
        if shard not in self.shard_ids:
            raise ValueError(f"{what}: unknown shard; this layer packs {self.shard_ids}")
        method, dim = self.quant_method, self.split_dim(param)
        if dim is not None and self.ctx.parallel.size > 1:
            tensor = method.tp_part(self, param, tensor, dim, *self.rank_part(shard))
        dst, rows = param.data, getattr(param, "output_dim", None)
        if rows is not None:
            start, end = self.shard_range(shard)
            dst = dst.narrow(rows, *method.shard_range(self, param, rows, start, end - start))
        copy_checked(dst, tensor, what)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x, self.bias)


class ReplicatedLinear(Linear):
    """Every rank holds the whole weight (small projections such as MLA's low-rank ones, routers)."""

    def __init__(
        self,
        ctx: ModelContext,
        in_features: int,
        out_features: int,
        *,
        bias: bool = False,
        prefix: str = "",
        quant_config: QuantConfig | None = None,
    ):
        super().__init__(ctx, in_features, [out_features], bias=bias, prefix=prefix, quant_config=quant_config)


class ColumnParallelLinear(Linear):
    """Output features split over ranks; each rank computes its slice, no communication."""

    tp_dim = 0

    def __init__(
        self,
        ctx: ModelContext,
        in_features: int,
        out_features: int,
        *,
        bias: bool = False,
        prefix: str = "",
        quant_config: QuantConfig | None = None,
    ):
        super().__init__(
            ctx,
            in_features,
            [divide(out_features, ctx.parallel.size, "output features")],
            bias=bias,
            prefix=prefix,
            quant_config=quant_config,
        )


class MergedColumnParallelLinear(Linear):
    """Several column-parallel outputs packed in one weight (gate_up_proj: shards 0 and 1)."""

    tp_dim = 0

    def __init__(
        self,
        ctx: ModelContext,
        in_features: int,
        out_features: Sequence[int],
        *,
        bias: bool = False,
        prefix: str = "",
        quant_config: QuantConfig | None = None,
    ):
        splits = [divide(n, ctx.parallel.size, "output features") for n in out_features]
        super().__init__(
            ctx,
            in_features,
            splits,
            bias=bias,
            shard_ids=list(range(len(out_features))),
            prefix=prefix,
            quant_config=quant_config,
        )


class QKVParallelLinear(Linear):
    """q, k and v projections packed in one weight; heads split over ranks (shards "q", "k", "v").

    With fewer KV heads than ranks, each KV head is replicated on the ranks that need it. Values are
    ``v_head_dim`` wide per head when given (MiMo-V2-Flash's Dv < D), else ``head_dim``.
    """

    tp_dim = 0

    def __init__(
        self,
        ctx: ModelContext,
        hidden: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        *,
        bias: bool = False,
        v_head_dim: int | None = None,
        prefix: str = "",
        quant_config: QuantConfig | None = None,
    ):
        size = ctx.parallel.size
        self.num_heads = divide(num_heads, size, "attention heads")
        if num_kv_heads >= size:
            self.num_kv_heads = divide(num_kv_heads, size, "KV heads")
        else:
            divide(size, num_kv_heads, "ranks per KV head")
            self.num_kv_heads = 1
        self.total_kv_heads, self.head_dim = num_kv_heads, head_dim
        v_dim = v_head_dim or head_dim
        splits = [self.num_heads * head_dim, self.num_kv_heads * head_dim, self.num_kv_heads * v_dim]
        super().__init__(
            ctx, hidden, splits, bias=bias, shard_ids=["q", "k", "v"], prefix=prefix, quant_config=quant_config
        )

    def kv_heads_held(self) -> tuple[int, int]:
        """(this rank's first KV head, the checkpoint's KV heads): where its KV cache sits in one rank's."""
        return self.rank_part("k")[0] * self.num_kv_heads, self.total_kv_heads

    def rank_part(self, shard: Any) -> tuple[int, int]:
        if shard == "q" or self.ctx.parallel.size == 1:
            return super().rank_part(shard)
        # the checkpoint's k/v hold total_kv_heads heads; this rank needs num_kv_heads of them
        replicas = max(1, self.ctx.parallel.size // self.total_kv_heads)
        head = self.ctx.parallel.rank // replicas
        return head, self.total_kv_heads // self.num_kv_heads


class RowParallelLinear(Linear):
    """Input features split over ranks; the partial products are summed by an explicit all_reduce."""

    tp_dim = 1

    def __init__(
        self,
        ctx: ModelContext,
        in_features: int,
        out_features: int,
        *,
        bias: bool = False,
        reduce: bool = True,
        prefix: str = "",
        quant_config: QuantConfig | None = None,
    ):
        super().__init__(
            ctx,
            divide(in_features, ctx.parallel.size, "input features"),
            [out_features],
            bias=bias,
            prefix=prefix,
            quant_config=quant_config,
        )
        self.reduce = reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.quant_method.apply(self, x)
        if self.reduce:
            y = self.ctx.parallel.all_reduce(y)
        return y if self.bias is None else y + self.bias
