"""The cache pools of a model: its paged entries in blocks, its state entries in slots, bound to its layers."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from hetero.engine.layers.cached import CachedLayer, PagedEntry, Shard, StateEntry
from hetero.engine.runtime.cache_io import write_sequence_cache
from hetero.engine.runtime.cache_ops import CacheOp, CopySlot, ImportCache, ResetSlot

__all__ = ["CachePools", "bytes_per_block", "bytes_per_state_slot", "allocate_kv_cache"]


def _cached_layers(model: nn.Module) -> list[tuple[str, CachedLayer]]:
    return [(path, m) for path, m in model.named_modules() if isinstance(m, CachedLayer)]


def _entries(model: nn.Module, kind: type) -> list[tuple[str, CachedLayer, PagedEntry | StateEntry]]:
    return [
        (path, layer, e) for path, layer in _cached_layers(model) for e in layer.cache_spec() if isinstance(e, kind)
    ]


def bytes_per_block(model: nn.Module, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block of the paged pool takes over every per-token entry of ``model``."""
    return sum(
        e.slots_per_block(block_size) * math.prod(e.shape) * (e.dtype or dtype).itemsize
        for _, _, e in _entries(model, PagedEntry)
    )


def bytes_per_state_slot(model: nn.Module, dtype: torch.dtype) -> int:
    """Bytes one slot of the state pool takes over every per-sequence entry of ``model`` (0: no state)."""
    return sum(math.prod(e.shape) * (e.dtype or dtype).itemsize for _, _, e in _entries(model, StateEntry))


@dataclass
class CachePools:
    """Every cache tensor of a model, by ``"{layer path}.{entry name}"``.

    ``paged[name]`` is ``[num_blocks, block_size, *shape]``; ``state[name]`` is
    ``[num_state_slots, *shape]``; ``zeroed`` names the state entries reset to zeros
    when a sequence takes a slot (``init="zeros"``); ``tokens_per_slot`` the paged entries
    with one slot per several tokens (``[num_blocks, block_size // m or 1, *shape]``); ``shards`` this
    tensor-parallel rank's part of each entry it holds only a part of (``layers.cached.Shard``).
    """

    block_size: int
    paged: dict[str, torch.Tensor] = field(default_factory=dict)
    tokens_per_slot: dict[str, int] = field(default_factory=dict)
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    zeroed: tuple[str, ...] = ()
    shards: dict[str, Shard] = field(default_factory=dict)

    def apply(self, ops: list[CacheOp]) -> None:
        """Apply allocation's cache ops in order (before the step that needs them)."""
        for op in ops:
            if isinstance(op, ResetSlot):
                for name in self.zeroed:
                    self.state[name][op.slot].zero_()
            elif isinstance(op, CopySlot):
                for t in self.state.values():
                    t[op.dst].copy_(t[op.src])
            elif isinstance(op, ImportCache):
                write_sequence_cache(self, op.block_table, op.slot, op.cache)
            else:
                raise TypeError(f"unknown cache op {op!r}")


def allocate_kv_cache(
    model: nn.Module,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
    num_state_slots: int = 0,
) -> CachePools:
    """Allocate every entry of every cached layer of ``model`` and bind the tensors to their layers.

    Paged entries are filled with their ``fill`` (NaN by default, so a read of a slot nobody
    wrote shows up in the output). State entries get ``num_state_slots`` slots, NaN until
    a sequence takes one (then zeroed, for ``init="zeros"``); a model with state entries
    needs ``num_state_slots >= 1``.
    """
    pools = CachePools(block_size)
    zeroed = []
    for path, layer in _cached_layers(model):
        tensors = {}
        for e in layer.cache_spec():
            if e.shard is not None:
                pools.shards[f"{path}.{e.name}"] = e.shard
            if isinstance(e, PagedEntry):
                slots = e.slots_per_block(block_size)
                t = torch.full((num_blocks, slots, *e.shape), e.fill, dtype=e.dtype or dtype, device=device)
                pools.paged[f"{path}.{e.name}"] = t
                if e.tokens_per_slot > 1:
                    if block_size & (block_size - 1):
                        raise ValueError(f"{path}: entry '{e.name}' needs a power-of-two block size, got {block_size}")
                    pools.tokens_per_slot[f"{path}.{e.name}"] = e.tokens_per_slot
            else:
                if num_state_slots < 1:
                    raise ValueError(f"{path}: state entry '{e.name}' needs num_state_slots >= 1")
                t = torch.empty((num_state_slots, *e.shape), dtype=e.dtype or dtype, device=device)
                t.fill_(float("nan") if t.is_floating_point() else -1)  # poison: no slot is read before it is given
                pools.state[f"{path}.{e.name}"] = t
                if e.init == "zeros":
                    zeroed.append(f"{path}.{e.name}")
            tensors[e.name] = t
        layer.bind_cache(**tensors)
    pools.zeroed = tuple(zeroed)
    return pools
