"""Changes to the cache tensors that allocation decides on the host and the runner applies, in order,
before the next step's forward (so a snapshot is taken before the state moves on)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ResetSlot", "CopySlot", "ImportCache", "CacheOp"]


@dataclass(frozen=True)
class ResetSlot:
    """A sequence starts from no state in ``slot``: entries declared ``init="zeros"`` are zeroed."""

    slot: int


@dataclass(frozen=True)
class CopySlot:
    """Copy every state entry of slot ``src`` into slot ``dst`` (taking or restoring a snapshot)."""

    src: int
    dst: int


@dataclass(frozen=True)
class ImportCache:
    """Write an exported cache (``hetero.engine.runtime.cache_io.SequenceCache``) into a sequence's
    blocks and state slot."""

    block_table: tuple[int, ...]
    slot: int | None
    cache: Any


CacheOp = ResetSlot | CopySlot | ImportCache
