"""The scheduler's view of the cache: one allocator per pool, coordinated so a sequence holds all or nothing."""

from __future__ import annotations

from typing import Any

from hetero.engine.runtime.block_allocator import BlockAllocator
from hetero.engine.runtime.cache_ops import CacheOp, ImportCache
from hetero.engine.runtime.sequence import Sequence
from hetero.engine.runtime.slot_allocator import SlotAllocator

__all__ = ["BlockManager"]


class BlockManager:
    """Allocates, frees and prefix-matches a sequence's cache over every pool of the model.

    - The paged pool (``BlockAllocator``): ``num_blocks`` blocks of ``block_size``
      tokens, for every per-token entry (K/V, latents, indexer keys).
    - The state pool (``SlotAllocator``, only when ``num_state_slots`` > 0): one
      slot per running sequence for every per-sequence entry (recurrent states), or a group of
      ``state_group`` (speculative decoding's per-token states), plus ``num_state_snapshots``
      snapshot slots for prefix caching.

    A prefix hit is the minimum over pools: the paged pool's cached blocks, cut back
    to the longest prefix whose state snapshot exists. A model with state and no
    snapshots therefore never reuses a block: cached KV without the recurrent state
    that goes with it would give wrong tokens. Tensor changes (resetting or
    copying a slot, importing a sequence's cache) are queued and handed to the
    runner through ``take_ops``.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        *,
        num_state_slots: int = 0,
        num_state_snapshots: int = 0,
        state_group: int = 1,
    ):
        self.blocks = BlockAllocator(num_blocks, block_size, enable_prefix_caching)
        self.slots = SlotAllocator(num_state_slots, num_state_snapshots, state_group) if num_state_slots else None
        self._ops: list[CacheOp] = []

    def record_kv_events(self) -> None:
        """From now on, keep the prefix cache's KV events (``hetero.engine.kv_events``) for ``take_kv_events``."""
        if self.blocks.events is None:
            self.blocks.events = []

    def take_kv_events(self) -> list:
        """The KV events since the last call, oldest first (none unless ``record_kv_events`` was called)."""
        events = self.blocks.events
        if events is None:
            return []
        self.blocks.events = []
        return events

    def reset_prefix_cache(self) -> int:
        """Evict every cached block no sequence uses (vLLM's ``reset_prefix_cache``); how many were."""
        return self.blocks.reset_prefix_cache()

    @property
    def num_blocks(self) -> int:
        return self.blocks.num_blocks

    @property
    def block_size(self) -> int:
        return self.blocks.block_size

    @property
    def num_free_blocks(self) -> int:
        return self.blocks.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.blocks.num_used_blocks

    @property
    def snapshots_state(self) -> bool:
        """Whether states are snapshotted at full blocks (a stateful model with prefix caching and snapshot slots)."""
        return self.slots is not None and self.slots.num_snapshots > 0 and self.blocks.enable_prefix_caching

    def blocks_needed(self, num_tokens: int) -> int:
        return self.blocks.blocks_needed(num_tokens)

    def ref_count(self, block_id: int) -> int:
        return self.blocks.ref_count(block_id)

    def _hits(self, seq: Sequence, reuse: bool) -> tuple[list[int], list[int]]:
        if not reuse:
            return [], []
        ids, hashes = self.blocks.lookup(seq)
        if self.slots is not None:
            k = self.slots.hit_blocks(hashes)
            ids, hashes = ids[:k], hashes[:k]
        return ids, hashes

    def can_allocate(self, seq: Sequence, reuse: bool = True, extra: int = 0) -> bool:
        """Whether ``allocate(seq, reuse, extra)`` would find enough blocks (and a state slot) now."""
        ids, _ = self._hits(seq, reuse)
        return self.blocks.can_allocate(seq, ids, extra) and (self.slots is None or self.slots.num_free_slots > 0)

    def allocate(self, seq: Sequence, reuse: bool = True, extra: int = 0) -> int:
        """Give ``seq`` (holding nothing) its blocks and state slot; return how many tokens are already cached.

        The cached count is a multiple of the block size and always leaves the last token
        to compute; ``reuse=False`` takes fresh blocks only (a sequence whose cache is
        imported must not write into blocks others share); ``extra``: room for that many positions after
        its tokens (draft tokens). Raises RuntimeError when a
        pool is short (ask ``can_allocate`` first).
        """
        if not self.can_allocate(seq, reuse, extra):
            raise RuntimeError(f"not enough free KV blocks or state slots for sequence {seq.request_id}")
        ids, hashes = self._hits(seq, reuse)
        self.blocks.allocate(seq, ids, hashes, extra)
        if self.slots is not None:
            self._ops.append(self.slots.allocate(seq, hashes[-1] if hashes else None))
        return len(ids) * self.block_size

    def import_cache(self, seq: Sequence, cache: Any) -> None:
        """Queue the write of an exported cache (``cache_io.SequenceCache``) into ``seq``'s blocks and slot."""
        self._ops.append(ImportCache(tuple(seq.block_table), seq.state_slot, cache))

    def can_append(self, seq: Sequence, extra: int = 0) -> bool:
        """Whether ``append_slot(seq, extra)`` would find its blocks now."""
        return self.blocks.can_append(seq, extra)

    def append_slot(self, seq: Sequence, extra: int = 0) -> None:
        """Make room for all of ``seq``'s tokens and ``extra`` positions after them (draft tokens)."""
        self.blocks.append_slot(seq, extra)

    def cache_computed(self, seq: Sequence) -> None:
        """Register the blocks of ``seq`` that became full and computed, and snapshot its state when
        its computed tokens end exactly on such a block (call after each step)."""
        self.blocks.cache_computed(seq)
        if (
            self.slots is not None
            and seq.block_hashes
            and seq.num_computed_tokens == len(seq.block_hashes) * self.block_size
        ):
            op = self.slots.snapshot(seq, seq.block_hashes[-1])
            if op is not None:
                self._ops.append(op)

    def free(self, seq: Sequence) -> None:
        """Release ``seq``'s blocks (last block first, so its prefix stays cached longest) and slot."""
        self.blocks.free(seq)
        if self.slots is not None:
            self.slots.free(seq)

    def take_ops(self) -> list[CacheOp]:
        """The queued cache ops, oldest first; the queue is emptied."""
        ops, self._ops = self._ops, []
        return ops
