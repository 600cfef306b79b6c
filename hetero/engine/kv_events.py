"""What the prefix cache tells a cache-aware router: blocks stored (computed and registered under their hash)
and removed (evicted), as vLLM's KV events name them (``vllm/distributed/kv_events.py``).

``BlockManager.record_kv_events`` turns them on and ``take_kv_events`` drains them; ``hetero serve`` does so
after each step and publishes them (``hetero.serve.kv_events``). Hashes are the allocator's own,
as unsigned 64-bit integers: a router uses them only to chain a block to its parent and to remove it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["BlockStored", "BlockRemoved", "AllBlocksCleared", "wire_hash", "to_wire"]

_U64 = (1 << 64) - 1


def wire_hash(h: int | None) -> int | None:
    """A block hash as the unsigned 64-bit integer vLLM's events carry."""
    return None if h is None else h & _U64


@dataclass(frozen=True)
class BlockStored:
    """Blocks whose KV is computed and reusable: ``block_hashes`` in order, each following the one before
    (the first follows ``parent_block_hash``, None at a sequence's start); ``token_ids`` all their tokens."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int


@dataclass(frozen=True)
class BlockRemoved:
    """Blocks evicted from the prefix cache (their ids handed to other tokens)."""

    block_hashes: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class AllBlocksCleared:
    """Every cached block was dropped."""


def to_wire(event: BlockStored | BlockRemoved | AllBlocksCleared, medium: str = "GPU") -> dict[str, Any]:
    """The event as the map vLLM's publisher encodes (``"type"`` and its fields; ``medium`` "GPU" is the
    device's memory, whatever the device)."""
    if isinstance(event, BlockStored):
        return {
            "type": "BlockStored",
            "block_hashes": [wire_hash(h) for h in event.block_hashes],
            "parent_block_hash": wire_hash(event.parent_block_hash),
            "token_ids": list(event.token_ids),
            "block_size": event.block_size,
            "lora_id": None,
            "medium": medium,
            "lora_name": None,
        }
    if isinstance(event, BlockRemoved):
        return {"type": "BlockRemoved", "block_hashes": [wire_hash(h) for h in event.block_hashes], "medium": medium}
    return {"type": "AllBlocksCleared"}
