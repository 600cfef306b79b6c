"""Linear layers over ``gemm``, split for tensor parallelism, each parameter with its own weight loader.

Every parameter of the engine carries two attributes the loader relies on:
``weight_loader(param, tensor, shard)`` copies one checkpoint tensor into it (this
rank's slice of it, at the offset of ``shard`` for packed parameters: q/k/v in
qkv_proj, 0/1 for gate/up in gate_up_proj), and ``shards``, the tuple of shard
ids the parameter needs ((None,) when it is not packed). The loader
(``hetero.engine.loader``) records which (parameter, shard) pairs it filled.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from hetero.engine.context import ModelContext
from hetero.engine.parallel import divide

__all__ = ["Linear", "ColumnParallelLinear", "MergedColumnParallelLinear", "QKVParallelLinear",
           "RowParallelLinear", "ReplicatedLinear", "copy_checked"]


def copy_checked(param: torch.Tensor, tensor: torch.Tensor, what: str) -> None:
    """Copy ``tensor`` into ``param`` or raise a ValueError naming both shapes."""
    if tuple(param.shape) != tuple(tensor.shape):
        raise ValueError(f"{what}: expected shape {tuple(param.shape)}, the checkpoint has {tuple(tensor.shape)}")
    param.data.copy_(tensor.to(param.dtype))


class Linear(nn.Module):
    """y = x @ W.T (+ b), W [out, in] as in nn.Linear, through the backend's ``gemm``.

    ``out_splits`` lists the sizes of the logical outputs packed into W (one shard
    each) on this rank; ``tp_dim`` is the dimension split over ranks (0: columns,
    1: rows, None: replicated).
    """

    tp_dim: int | None = None

    def __init__(self, ctx: ModelContext, in_features: int, out_splits: Sequence[int], *, bias: bool = False,
                 shard_ids: Sequence[Any] | None = None):
        super().__init__()
        self.ctx = ctx
        self.in_features = in_features
        self.out_splits = list(out_splits)
        self.shard_ids = list(shard_ids) if shard_ids is not None else [None]
        self.weight = nn.Parameter(ctx.empty(sum(out_splits), in_features), requires_grad=False)
        self.weight.weight_loader, self.weight.shards = self.load_weight, tuple(self.shard_ids)
        self.bias = None
        if bias:
            self.bias = nn.Parameter(ctx.empty(sum(out_splits)), requires_grad=False)
            self.bias.weight_loader, self.bias.shards = self.load_weight, tuple(self.shard_ids)
        ctx.bind_op(self, "_gemm", "gemm")

    def shard_range(self, shard: Any) -> tuple[int, int]:
        """Rows of the local weight that hold ``shard``."""
        i = self.shard_ids.index(shard)
        start = sum(self.out_splits[:i])
        return start, start + self.out_splits[i]

    def rank_slice(self, tensor: torch.Tensor, dim: int, shard: Any) -> torch.Tensor:
        """This rank's part of a full checkpoint tensor along ``dim``."""
        if self.tp_dim is None or self.ctx.parallel.size == 1 or dim != self.tp_dim or tensor.ndim <= dim:
            return tensor
        size = tensor.shape[dim] // self.ctx.parallel.size
        return tensor.narrow(dim, self.ctx.parallel.rank * size, size)

    def load_weight(self, param: nn.Parameter, tensor: torch.Tensor, shard: Any = None) -> None:
        what = f"{type(self).__name__} shard {shard!r}" if shard is not None else type(self).__name__
        if shard not in self.shard_ids:
            raise ValueError(f"{what}: unknown shard; this layer packs {self.shard_ids}")
        start, end = self.shard_range(shard)
        if self.tp_dim == 0:
            local = self.rank_slice(tensor, 0, shard)
        elif self.tp_dim == 1 and param.ndim == 2:
            local = self.rank_slice(tensor, 1, shard)
        else:
            local = tensor  # replicated, or a row-parallel bias (added once, after the all-reduce)
        copy_checked(param.data.narrow(0, start, end - start), local, what)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._gemm(x, self.weight, bias=self.bias)


class ReplicatedLinear(Linear):
    """Every rank holds the whole weight (small projections such as MLA's low-rank ones, routers)."""

    def __init__(self, ctx: ModelContext, in_features: int, out_features: int, *, bias: bool = False):
        super().__init__(ctx, in_features, [out_features], bias=bias)


class ColumnParallelLinear(Linear):
    """Output features split over ranks; each rank computes its slice, no communication."""

    tp_dim = 0

    def __init__(self, ctx: ModelContext, in_features: int, out_features: int, *, bias: bool = False):
        super().__init__(ctx, in_features, [divide(out_features, ctx.parallel.size, "output features")], bias=bias)


class MergedColumnParallelLinear(Linear):
    """Several column-parallel outputs packed in one weight (gate_up_proj: shards 0 and 1)."""

    tp_dim = 0

    def __init__(self, ctx: ModelContext, in_features: int, out_features: Sequence[int], *, bias: bool = False):
        splits = [divide(n, ctx.parallel.size, "output features") for n in out_features]
        super().__init__(ctx, in_features, splits, bias=bias, shard_ids=list(range(len(out_features))))


class QKVParallelLinear(Linear):
    """q, k and v projections packed in one weight; heads split over ranks (shards "q", "k", "v").

    With fewer KV heads than ranks, each KV head is replicated on the ranks that need it.
    """

    tp_dim = 0

    def __init__(self, ctx: ModelContext, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, *, bias: bool = False):
        size = ctx.parallel.size
        self.num_heads = divide(num_heads, size, "attention heads")
        if num_kv_heads >= size:
            self.num_kv_heads = divide(num_kv_heads, size, "KV heads")
        else:
            divide(size, num_kv_heads, "ranks per KV head")
            self.num_kv_heads = 1
        self.total_kv_heads, self.head_dim = num_kv_heads, head_dim
        splits = [self.num_heads * head_dim, self.num_kv_heads * head_dim, self.num_kv_heads * head_dim]
        super().__init__(ctx, hidden, splits, bias=bias, shard_ids=["q", "k", "v"])

    def rank_slice(self, tensor: torch.Tensor, dim: int, shard: Any) -> torch.Tensor:
        if shard == "q" or self.ctx.parallel.size == 1:
            return super().rank_slice(tensor, dim, shard)
        rows = self.num_kv_heads * self.head_dim
        replicas = max(1, self.ctx.parallel.size // self.total_kv_heads)
        head = self.ctx.parallel.rank // replicas
        return tensor.narrow(dim, head * rows, rows)


class RowParallelLinear(Linear):
    """Input features split over ranks; the partial products are summed by an explicit all_reduce."""

    tp_dim = 1

    def __init__(self, ctx: ModelContext, in_features: int, out_features: int, *, bias: bool = False, reduce: bool = True):
        super().__init__(ctx, divide(in_features, ctx.parallel.size, "input features"), [out_features], bias=bias)
        self.reduce = reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._gemm(x, self.weight)
        if self.reduce:
            y = self.ctx.parallel.all_reduce(y)
        return y if self.bias is None else y + self.bias
