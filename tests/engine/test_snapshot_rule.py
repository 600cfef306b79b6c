"""``BlockManager``'s snapshot rule for models with per-sequence state, on the manager alone: a state is
snapshotted only where the computed tokens end exactly on a full block, a prefix hit is cut back to the
longest prefix whose state snapshot exists, and the new sequence's slot starts from the snapshot at the
end of that hit. (test_state_cache.py checks the same through a toy model's tokens.)"""

from __future__ import annotations

from hetero.engine.runtime.block_manager import BlockManager
from hetero.engine.runtime.cache_ops import CopySlot, ResetSlot
from hetero.engine.runtime.sequence import Sequence

BS = 4
PROMPT = list(range(1, 11))  # 10 tokens: two full blocks and a partial one


def _manager(**kw) -> BlockManager:
    return BlockManager(16, BS, True, **{"num_state_slots": 2, "num_state_snapshots": 4, **kw})


def _compute(bm: BlockManager, seq: Sequence, ends: list[int]) -> list[list]:
    """Compute ``seq`` in chunks ending at each of ``ends`` as the scheduler does; the ops each chunk queued."""
    ops = []
    for n in ends:
        seq.num_computed_tokens = n
        bm.cache_computed(seq)
        ops.append(bm.take_ops())
    return ops


def test_a_state_is_snapshotted_only_at_the_end_of_a_full_block():
    bm = _manager()
    seq = Sequence("a", PROMPT)
    assert bm.allocate(seq) == 0
    assert bm.take_ops() == [ResetSlot(seq.state_slot)]
    mid, end, tail = _compute(bm, seq, [6, 8, 10])
    assert mid == [], "6 tokens computed: the state is past block 1's end, not at it"
    assert len(end) == 1 and isinstance(end[0], CopySlot) and end[0].src == seq.state_slot
    assert tail == []


def test_a_hit_is_cut_back_to_the_last_block_with_a_snapshot():
    bm = _manager()
    first = Sequence("a", PROMPT)
    bm.allocate(first)
    bm.take_ops()
    at_4, at_10 = _compute(bm, first, [4, 10])  # block 0 ends at a computed state, block 1 does not
    assert len(at_4) == 1 and at_10 == []
    bm.free(first)
    second = Sequence("b", PROMPT[:9] + [99])
    assert len(bm.blocks.lookup(second)[0]) == 2, "the paged pool alone holds both blocks"
    assert bm.allocate(second) == BS, "only block 0 has the state at its end"
    assert len(second.block_hashes) == 1 and len(second.block_table) == 3
    assert bm.take_ops() == [CopySlot(at_4[0].dst, second.state_slot)]


def test_the_slot_starts_from_the_snapshot_at_the_end_of_the_hit():
    bm = _manager()
    first = Sequence("a", PROMPT)
    bm.allocate(first)
    bm.take_ops()
    at_4, at_8, _ = _compute(bm, first, [4, 8, 10])
    assert at_4[0].dst != at_8[0].dst
    bm.free(first)
    second = Sequence("b", PROMPT[:8] + [99, 98])
    assert bm.allocate(second) == 2 * BS
    assert bm.take_ops() == [CopySlot(at_8[0].dst, second.state_slot)]


def test_without_snapshot_slots_nothing_is_snapshotted_or_served():
    bm = _manager(num_state_snapshots=0)
    assert not bm.snapshots_state
    first = Sequence("a", PROMPT)
    bm.allocate(first)
    bm.take_ops()
    assert _compute(bm, first, [4, 8, 10]) == [[], [], []]
    bm.free(first)
    assert bm.allocate(Sequence("b", PROMPT)) == 0
