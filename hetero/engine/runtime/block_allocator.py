"""Paged-pool allocation: KV blocks with reference counts and prefix caching over full blocks."""

from __future__ import annotations

import math

from hetero.engine.kv_events import BlockRemoved, BlockStored
from hetero.engine.runtime.sequence import Sequence

__all__ = ["BlockAllocator", "block_hash"]


class _Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None
        self.token_ids: tuple[int, ...] = ()


def block_hash(parent: int | None, token_ids: tuple[int, ...]) -> int:
    """The prefix-cache key of a full block: its tokens and, through ``parent``, everything before them."""
    return hash((parent, token_ids))


class BlockAllocator:
    """Hands out the ``num_blocks`` KV blocks of ``block_size`` tokens to sequences.

    With ``enable_prefix_caching``, every full block whose KV has been computed is
    registered under a hash chained over all tokens up to its end; a later sequence
    with the same leading tokens reuses those blocks (reference counted) instead of
    computing them. A cached block whose last user is freed keeps its contents until
    its id is handed out again; free blocks are handed out least recently freed first.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"BlockManager needs num_blocks >= 1 and block_size >= 1, got {num_blocks} and {block_size}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._blocks = [_Block(i) for i in range(num_blocks)]
        self._free: dict[int, None] = dict.fromkeys(range(num_blocks))  # insertion order = order freed
        self._cached: dict[int, int] = {}  # block hash -> block id
        self.events: list | None = None  # a list: KV events (``kv_events``) are appended to it

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence uses (cached ones among them stay reusable until handed out)."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_needed(self, num_tokens: int) -> int:
        return math.ceil(num_tokens / self.block_size)

    def ref_count(self, block_id: int) -> int:
        return self._blocks[block_id].ref_count

    def lookup(self, seq: Sequence) -> tuple[list[int], list[int]]:
        """Cached block ids and their hashes for the leading full blocks of ``seq``, short of its last token."""
        ids: list[int] = []
        hashes: list[int] = []
        if not self.enable_prefix_caching:
            return ids, hashes
        bs, parent = self.block_size, None
        for i in range((seq.num_tokens - 1) // bs):
            tokens = tuple(seq.tokens(i * bs, (i + 1) * bs))
            h = block_hash(parent, tokens)
            block_id = self._cached.get(h)
            if block_id is None or self._blocks[block_id].token_ids != tokens:
                break
            ids.append(block_id)
            hashes.append(h)
            parent = h
        return ids, hashes

    def can_allocate(self, seq: Sequence, hits: list[int], extra: int = 0) -> bool:
        """Whether ``allocate(seq, hits, ..., extra)`` would find enough blocks now."""
        in_use = sum(1 for b in hits if self._blocks[b].ref_count > 0)
        return self.blocks_needed(seq.num_tokens + extra) - in_use <= len(self._free)

    def allocate(self, seq: Sequence, hits: list[int], hashes: list[int], extra: int = 0) -> None:
        """Give ``seq`` (holding no blocks) the cached blocks ``hits`` (a prefix of ``lookup``'s, with their
        ``hashes``) and fresh blocks for the rest of its tokens and ``extra`` positions after them (where
        draft tokens are written). RuntimeError when there are not enough."""
        if seq.block_table:
            raise RuntimeError(f"sequence {seq.request_id} already holds blocks")
        if not self.can_allocate(seq, hits, extra):
            raise RuntimeError(f"not enough free KV blocks for sequence {seq.request_id}")
        for block_id in hits:
            block = self._blocks[block_id]
            if block.ref_count == 0:
                del self._free[block_id]
            block.ref_count += 1
        fresh = self.blocks_needed(seq.num_tokens + extra) - len(hits)
        seq.block_table = hits + [self._take() for _ in range(fresh)]
        seq.block_hashes = list(hashes)

    def can_append(self, seq: Sequence, extra: int = 0) -> bool:
        """Whether ``append_slot(seq, extra)`` would find its blocks now."""
        return self.blocks_needed(seq.num_tokens + extra) - len(seq.block_table) <= len(self._free)

    def append_slot(self, seq: Sequence, extra: int = 0) -> None:
        """Make room for all of ``seq``'s tokens and ``extra`` positions after them (new blocks as needed)."""
        while len(seq.block_table) < self.blocks_needed(seq.num_tokens + extra):
            if not self._free:
                raise RuntimeError(f"no free KV block for sequence {seq.request_id}")
            seq.block_table.append(self._take())

    def cache_computed(self, seq: Sequence) -> None:
        """Register the blocks of ``seq`` that became full and computed (call after each step)."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        for i in range(len(seq.block_hashes), seq.num_computed_tokens // bs):
            tokens = tuple(seq.tokens(i * bs, (i + 1) * bs))
            h = block_hash(seq.block_hashes[-1] if seq.block_hashes else None, tokens)
            seq.block_hashes.append(h)
            block = self._blocks[seq.block_table[i]]
            if h not in self._cached and block.hash is None:
                block.hash, block.token_ids = h, tokens
                self._cached[h] = block.block_id
                if self.events is not None:
                    parent = seq.block_hashes[-2] if len(seq.block_hashes) > 1 else None
                    self.events.append(BlockStored([h], parent, list(tokens), bs))

    def free(self, seq: Sequence) -> None:
        """Release ``seq``'s blocks, last block first (so its prefix stays cached longest)."""
        for block_id in reversed(seq.block_table):
            block = self._blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
        seq.block_table = []
        seq.block_hashes = []

    def _take(self) -> int:
        """The least recently freed block, its cached contents (if any) evicted."""
        block_id = next(iter(self._free))
        del self._free[block_id]
        block = self._blocks[block_id]
        self._evict(block)
        block.ref_count = 1
        return block_id

    def _evict(self, block: _Block) -> None:
        if block.hash is not None:
            del self._cached[block.hash]
            if self.events is not None:
                self.events.append(BlockRemoved([block.hash]))
            block.hash, block.token_ids = None, ()

    def reset_prefix_cache(self) -> int:
        """Evict every cached block no sequence uses (vLLM's ``/reset_prefix_cache``); how many were."""
        idle = [self._blocks[b] for b in self._free if self._blocks[b].hash is not None]
        for block in idle:
            self._evict(block)
        return len(idle)
