"""State-pool allocation: one state slot per running sequence, and snapshots that let prefix caching
serve a hybrid model only where the state at the end of the hit exists."""

from __future__ import annotations

from collections import OrderedDict

from hetero.engine.runtime.cache_ops import CopySlot, ResetSlot
from hetero.engine.runtime.sequence import Sequence

__all__ = ["SlotAllocator"]


class SlotAllocator:
    """Hands out ``num_slots`` live state slots, and keeps up to ``num_snapshots`` snapshots.

    Slot ids ``[0, num_slots)`` are live slots, one per running sequence;
    ``[num_slots, num_slots + num_snapshots)`` hold snapshots: the state of a
    sequence right after the last token of a full block, keyed by that block's
    prefix hash (which names every token before it). A prefix-cache hit of k
    blocks is served only when the snapshot of block k exists; the least recently
    used snapshot is dropped first. Every tensor change the allocator decides is
    queued as a ``CacheOp`` for the runner to apply, in order, before the next step.

    With ``group`` > 1 (speculative decoding), each running sequence holds ``group`` consecutive
    slots (its ``state_slot`` is the first): a verify step writes the state after each of its rows
    into them, and the sequence's state is then in ``state_slot + state_column``. Live slots are
    ``[0, num_slots * group)``, snapshots the ``num_snapshots`` after them.
    """

    def __init__(self, num_slots: int, num_snapshots: int = 0, group: int = 1):
        if num_slots < 1 or num_snapshots < 0:
            raise ValueError(
                f"SlotAllocator needs num_slots >= 1 and num_snapshots >= 0, got {num_slots}, {num_snapshots}"
            )
        self.num_slots, self.num_snapshots, self.group = num_slots, num_snapshots, group
        self._free: dict[int, None] = dict.fromkeys(range(0, num_slots * group, group))
        self._snapshots: OrderedDict[int, int] = OrderedDict()  # block hash -> snapshot slot, LRU first
        live = num_slots * group
        self._spare = list(range(live + num_snapshots - 1, live - 1, -1))

    @property
    def num_free_slots(self) -> int:
        return len(self._free)

    def hit_blocks(self, hashes: list[int]) -> int:
        """The most leading blocks of ``hashes`` a sequence may reuse: the longest prefix whose last
        block has a snapshot (0 when none has)."""
        for k in range(len(hashes), 0, -1):
            if hashes[k - 1] in self._snapshots:
                return k
        return 0

    def allocate(self, seq: Sequence, hit_hash: int | None = None) -> ResetSlot | CopySlot:
        """Give ``seq`` a live slot, starting from the snapshot of ``hit_hash`` (else from no state)."""
        if seq.state_slot is not None:
            raise RuntimeError(f"sequence {seq.request_id} already holds state slot {seq.state_slot}")
        if not self._free:
            raise RuntimeError(f"no free state slot for sequence {seq.request_id}")
        slot = next(iter(self._free))
        del self._free[slot]
        seq.state_slot, seq.state_column = slot, 0
        if hit_hash is None:
            return ResetSlot(slot)
        self._snapshots.move_to_end(hit_hash)
        return CopySlot(self._snapshots[hit_hash], slot)

    def snapshot(self, seq: Sequence, block_hash: int) -> CopySlot | None:
        """Keep ``seq``'s current state (just after a full block, named by ``block_hash``) as a snapshot."""
        if self.num_snapshots == 0 or seq.state_slot is None:
            return None
        if block_hash in self._snapshots:
            self._snapshots.move_to_end(block_hash)
            return None
        target = self._spare.pop() if self._spare else self._snapshots.popitem(last=False)[1]
        self._snapshots[block_hash] = target
        return CopySlot(seq.state_slot + seq.state_column, target)

    def free(self, seq: Sequence) -> None:
        if seq.state_slot is not None:
            self._free[seq.state_slot] = None
            seq.state_slot, seq.state_column = None, 0
