"""BlockManager: allocation, reference counts, chained prefix caching and eviction order."""

from __future__ import annotations

import pytest

from hetero.engine.runtime.block_manager import BlockManager
from hetero.engine.runtime.sequence import Sequence

BS = 4


def seq(tokens, rid="r"):
    return Sequence(rid, list(tokens))


def computed(bm: BlockManager, s: Sequence) -> Sequence:
    """As if a step computed all of ``s``'s tokens: register its full blocks."""
    s.num_computed_tokens = s.num_tokens
    bm.cache_computed(s)
    return s


def test_allocate_gives_distinct_blocks_and_free_returns_them():
    bm = BlockManager(8, BS)
    a, b = seq(range(10), "a"), seq(range(100, 105), "b")
    assert bm.allocate(a) == 0 and len(a.block_table) == 3
    assert bm.allocate(b) == 0 and len(b.block_table) == 2
    assert len(set(a.block_table) | set(b.block_table)) == 5
    assert bm.num_free_blocks == 3
    bm.free(a)
    assert bm.num_free_blocks == 6 and a.block_table == []


def test_shared_prefix_hits_full_computed_blocks_only():
    bm = BlockManager(16, BS)
    a = seq(range(11), "a")  # blocks [0-3] [4-7] [8-10]
    assert bm.allocate(a) == 0
    b = seq(list(range(11)) + [50], "b")
    assert bm.allocate(b) == 0, "a's blocks are not computed yet: nothing may hit"
    bm.free(b)
    computed(bm, a)
    c = seq(list(range(8)) + [60, 61], "c")
    assert bm.allocate(c) == 8
    assert c.block_table[:2] == a.block_table[:2]
    assert c.block_table[2] != a.block_table[2]
    assert [bm.ref_count(x) for x in a.block_table] == [2, 2, 1]


def test_same_block_after_a_different_prefix_does_not_hit():
    bm = BlockManager(16, BS)
    a = seq([1, 2, 3, 4, 5, 6, 7, 8, 9], "a")
    bm.allocate(a)
    computed(bm, a)
    b = seq([0, 0, 0, 0, 5, 6, 7, 8, 9], "b")  # second block equal to a's, first differs
    assert bm.allocate(b) == 0
    assert set(b.block_table).isdisjoint(a.block_table)


def test_a_block_cached_after_one_prefix_is_not_served_after_another():
    bm = BlockManager(16, BS)
    A, B, C = [1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]
    for tokens in (A + B + [0], C + [0]):
        s = seq(tokens)
        bm.allocate(s)
        computed(bm, s)
    assert bm.allocate(seq(C + B + [0], "d")) == 4, "B's KV was computed after A, not after C"


def test_never_the_whole_prompt_is_cached():
    bm = BlockManager(16, BS)
    a = seq(range(8), "a")
    bm.allocate(a)
    computed(bm, a)
    b = seq(range(8), "b")  # the same 8 tokens: both blocks cached, but the last token must run
    assert bm.allocate(b) == 4
    assert b.block_table[0] == a.block_table[0] and b.block_table[1] != a.block_table[1]


def test_freed_cached_block_is_reused_until_evicted_least_recently_freed_first():
    bm = BlockManager(5, BS)
    a = seq(range(9), "a")  # 3 blocks, the first two full
    bm.allocate(a)
    computed(bm, a)
    first, second, _ = a.block_table
    bm.free(a)
    assert bm.num_free_blocks == 5
    b = seq(list(range(8)) + [99], "b")
    assert bm.allocate(b) == 8 and b.block_table[:2] == [first, second]
    assert bm.ref_count(first) == 1
    bm.free(b)  # tail first: the prefix blocks become the most recently freed
    big = seq([7] * 16, "big")  # takes 4 of 5 free blocks: evicts `second`, keeps `first`
    bm.allocate(big)
    assert second in big.block_table and first not in big.block_table
    bm.free(big)
    assert bm.allocate(seq(list(range(8)) + [1], "c")) == 4


def test_eviction_forgets_the_hash():
    bm = BlockManager(2, BS)
    a = seq(range(5), "a")
    bm.allocate(a)
    computed(bm, a)
    bm.free(a)
    other = seq([9] * 8, "other")  # takes both blocks: a's cached block is overwritten
    bm.allocate(other)
    bm.free(other)
    assert bm.allocate(seq(range(5), "again")) == 0


def test_can_allocate_counts_free_cached_hits_and_in_use_hits():
    bm = BlockManager(3, BS)
    a = seq(range(9), "a")
    bm.allocate(a)
    computed(bm, a)
    assert bm.num_free_blocks == 0
    b = seq(list(range(8)) + [5], "b")  # two blocks shared with a (in use), needs one more: none free
    assert not bm.can_allocate(b)
    with pytest.raises(RuntimeError):
        bm.allocate(b)
    bm.free(a)
    assert bm.can_allocate(b) and bm.allocate(b) == 8
    bm.free(b)  # all 3 free, two of them cached
    filler = seq([9], "filler")
    bm.allocate(filler)  # takes the uncached one
    assert not bm.can_allocate(b), "the two free cached hits are the only free blocks: one short"


def test_append_slot_adds_a_block_at_the_boundary():
    bm = BlockManager(3, BS)
    s = seq(range(4))
    bm.allocate(s)
    assert len(s.block_table) == 1
    s.output_token_ids.append(7)  # 5 tokens: the fifth starts a new block
    assert bm.can_append(s)
    bm.append_slot(s)
    assert len(s.block_table) == 2
    s.output_token_ids.append(8)
    bm.append_slot(s)
    assert len(s.block_table) == 2


def test_no_prefix_caching_never_hits():
    bm = BlockManager(16, BS, enable_prefix_caching=False)
    a = seq(range(9), "a")
    bm.allocate(a)
    computed(bm, a)
    assert bm.allocate(seq(range(9), "b")) == 0


def test_decode_tokens_fill_blocks_that_become_cacheable():
    bm = BlockManager(8, BS)
    s = seq(range(3), "s")
    bm.allocate(s)
    s.num_computed_tokens = 3
    s.output_token_ids.append(3)  # the sampled token completes block 0 once its KV is computed
    bm.append_slot(s)
    s.num_computed_tokens = 4
    bm.cache_computed(s)
    assert bm.allocate(seq([0, 1, 2, 3, 4], "t")) == 4
