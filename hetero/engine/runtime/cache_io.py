"""One sequence's cache out of the pools and back in, in a layout no device or block size is baked into.

Prefill/decode disaggregation moves a prefilled sequence to another engine this
way: the exporter reads the sequence's blocks and state slot, the importer writes
them into blocks and a slot of its own, which may be numbered and sized otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol
from typing import Sequence as Seq

import torch

__all__ = [
    "SequenceCache",
    "Pools",
    "export_sequence_cache",
    "gather_sequence_cache",
    "whole_shape",
    "write_sequence_cache",
    "check_fits",
]


class Pools(Protocol):
    """What this module reads of a model's cache pools (``kv_cache.CachePools`` is one): named here
    rather than imported, as ``CachePools`` applies a cache import through this module."""

    block_size: int
    paged: dict[str, torch.Tensor]
    state: dict[str, torch.Tensor]
    tokens_per_slot: dict[str, int]
    shards: dict[str, Any]  # name -> layers.cached.Shard: this tensor-parallel rank's part of the entry


@dataclass
class SequenceCache:
    """The cache of one sequence's first ``num_tokens`` tokens, every head of it (an export under tensor
    parallelism is gathered from the ranks' shards, and an import cut into them).

    ``paged[name]`` is ``[num_tokens, *shape]``, token-major, for every per-token entry
    (``name`` = ``"{layer path}.{entry}"``; ``[num_tokens // m, *shape]`` for an entry of one slot per m
    tokens); ``state[name]`` is the per-sequence state
    after those tokens. Every tensor is on the CPU, in the pool's dtype. ``token_ids``, when
    set, are the tokens the cache was computed from: an importer refuses the cache for a
    prompt that does not start with them.
    """

    num_tokens: int
    paged: dict[str, torch.Tensor] = field(default_factory=dict)
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    token_ids: list[int] | None = None


def _slots(pools: Pools, name: str, block_table: Seq[int], num_tokens: int, device: torch.device) -> torch.Tensor:
    """Pool slots of the entries of tokens ``[0, num_tokens)``: one per token, or one per m tokens (entry w in
    the block of its last token)."""
    block_size, m = pools.block_size, pools.tokens_per_slot.get(name, 1)
    if len(block_table) * block_size < num_tokens:
        raise ValueError(
            f"{num_tokens} tokens need {-(-num_tokens // block_size)} blocks of {block_size}, "
            f"the sequence holds {len(block_table)}"
        )
    last = (torch.arange(num_tokens // m, device=device) + 1) * m - 1
    per_block = max(1, block_size // m)
    table = torch.tensor(list(block_table), dtype=torch.int64, device=device)
    return table[last // block_size] * per_block + (last % block_size) // m


def export_sequence_cache(
    pools: Pools, block_table: Seq[int], slot: int | None, num_tokens: int, token_ids: Seq[int] | None = None
) -> SequenceCache:
    """Copy the entries of tokens ``[0, num_tokens)`` (in ``block_table``'s blocks) and of state ``slot`` to the CPU;
    ``token_ids``: those tokens, recorded with them."""
    out = SequenceCache(num_tokens, token_ids=list(token_ids[:num_tokens]) if token_ids is not None else None)
    for name, t in pools.paged.items():
        out.paged[name] = t.flatten(0, 1).index_select(0, _slots(pools, name, block_table, num_tokens, t.device)).cpu()
    for name, t in pools.state.items():
        if slot is None:
            raise ValueError(f"the model has state entry '{name}' but the sequence holds no state slot")
        out.state[name] = t[slot].cpu().clone()
    return out


def gather_sequence_cache(
    cache: SequenceCache, pools: Pools, all_gather: Callable[[torch.Tensor], torch.Tensor]
) -> SequenceCache:
    """The whole cache from ``cache``, this tensor-parallel rank's export (every rank calls it together):
    each sharded entry's rows from every rank put in place (``all_gather`` of ``[1, ...]`` gives
    ``[ranks, ...]``); the other entries, the same on every rank, as they are."""
    for kind, lead in (("paged", 1), ("state", 0)):
        entries = getattr(cache, kind)
        for name in sorted(n for n in entries if n in pools.shards):
            shard, mine = pools.shards[name], entries[name]
            parts = all_gather(mine.unsqueeze(0))
            rows = all_gather(torch.tensor([shard.rows], dtype=torch.int64))
            shape = list(mine.shape)
            shape[lead + shard.dim] = shard.total
            whole = torch.empty(shape, dtype=mine.dtype)
            for part, index in zip(parts, rows):
                whole.index_copy_(lead + shard.dim, index, part)
            entries[name] = whole
    return cache


def whole_shape(pools: Pools, name: str, shape) -> tuple[int, ...]:
    """An entry's shape (per token or per sequence) with every head, of this rank's ``shape``."""
    shape, shard = list(shape), pools.shards.get(name)
    if shard is not None:
        shape[shard.dim] = shard.total
    return tuple(shape)


def _mine(pools: Pools, name: str, t: torch.Tensor, lead: int) -> torch.Tensor:
    """This rank's part of a whole entry ``t`` (``lead`` dimensions before the entry's shape)."""
    shard = pools.shards.get(name)
    return t if shard is None else t.index_select(lead + shard.dim, torch.tensor(shard.rows, device=t.device))


def _check(kind: str, pools: Pools, got: dict[str, torch.Tensor], lead, cut: int) -> None:
    have = getattr(pools, kind)
    if set(have) != set(got):
        raise ValueError(f"the cache to import has {kind} entries {sorted(got)}, this model has {sorted(have)}")
    for name, t in have.items():
        want = (*lead(name), *whole_shape(pools, name, t.shape[cut:]))
        if tuple(got[name].shape) != want or got[name].dtype != t.dtype:
            raise ValueError(
                f"{kind} entry '{name}': expected {t.dtype} {list(want)}, "
                f"the cache to import has {got[name].dtype} {list(got[name].shape)}"
            )


def check_fits(pools: Pools, cache: SequenceCache) -> None:
    """ValueError unless ``cache`` has exactly the pools' entries, each of the right (whole) shape and dtype."""
    _check("paged", pools, cache.paged, lambda n: (cache.num_tokens // pools.tokens_per_slot.get(n, 1),), 2)
    _check("state", pools, cache.state, lambda n: (), 1)


def write_sequence_cache(pools: Pools, block_table: Seq[int], slot: int | None, cache: SequenceCache) -> None:
    """Write this rank's part of ``cache`` into ``block_table``'s blocks and state ``slot`` (ValueError when it
    does not fit the model)."""
    check_fits(pools, cache)
    for name, t in pools.paged.items():
        slots = _slots(pools, name, block_table, cache.num_tokens, t.device)
        t.flatten(0, 1).index_copy_(0, slots, _mine(pools, name, cache.paged[name], 1).to(t.device))
    for name, t in pools.state.items():
        if slot is None:
            raise ValueError(f"the model has state entry '{name}' but the sequence holds no state slot")
        t[slot].copy_(_mine(pools, name, cache.state[name], 0))
