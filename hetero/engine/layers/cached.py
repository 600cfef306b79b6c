"""Layers that keep per-sequence state between steps, and how they declare it.

A cached layer lists its entries once (``cache_spec``); the runtime allocates
each kind into its own pool and binds the tensors before the first step:

- a :class:`PagedEntry` is per-token (attention's K and V, MLA's latent): one
  tensor ``[num_blocks, block_size, *shape]``, addressed by ``Step.slot_mapping``
  and the block tables of ``Step.meta``; one with ``tokens_per_slot`` m > 1 holds one
  entry per m tokens (DeepSeek-V4's compressed entries) in the same blocks:
  ``[num_blocks, max(1, block_size // m), *shape]``, entry w in the block of its last
  token ``(w + 1) * m - 1`` (:func:`compressed_block_table`);
- a :class:`StateEntry` is per-sequence (a recurrent state, a running
  summary): one tensor ``[num_state_slots, *shape]``, addressed by
  ``Step.state_slots``; a sequence owns one slot from admission to its end.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

__all__ = [
    "CachedLayer",
    "PagedEntry",
    "StateEntry",
    "CacheEntry",
    "Shard",
    "STATE_INITS",
    "compressed_block_table",
]

#: How a state slot starts: "zeros", zeroed by the runtime when a sequence gets it;
#: "flag", left as it is, the layer reading ``Step.has_initial_state`` instead.
STATE_INITS = ("zeros", "flag")


@dataclass(frozen=True)
class Shard:
    """Where a tensor-parallel rank's entry sits in the entry one rank holding every head would have: along
    ``dim`` of the entry's shape (per token or per sequence) that entry has ``total`` rows, of which this rank
    holds ``rows``, in order. An entry without a shard is the same whole entry on every rank (replicated).
    A cache moved between instances of different tensor-parallel sizes is gathered and cut by it."""

    dim: int
    total: int
    rows: tuple[int, ...]

    @classmethod
    def of(cls, dim: int, total: int, rows) -> "Shard | None":
        """The shard, or None when ``rows`` is the whole."""
        rows = tuple(int(r) for r in rows)
        return None if rows == tuple(range(total)) else cls(dim, total, rows)


@dataclass(frozen=True)
class PagedEntry:
    """A per-token cache tensor: ``shape`` per token, ``dtype`` (None: the model's), ``fill`` at allocation;
    ``tokens_per_slot``: one slot per that many tokens (a power of two; 1: per token); ``shard``: this rank's
    part of it under tensor parallelism (None: whole).

    The default NaN fill makes a read of a slot nobody wrote show up in the output.
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype | None = None
    fill: float = float("nan")
    tokens_per_slot: int = 1
    shard: Shard | None = None

    def __post_init__(self) -> None:
        m = self.tokens_per_slot
        if m < 1 or m & (m - 1):
            raise ValueError(f"PagedEntry '{self.name}': tokens_per_slot must be a power of two >= 1, got {m}")

    def slots_per_block(self, block_size: int) -> int:
        """Slots of one block: ``block_size`` tokens' worth."""
        return max(1, block_size // self.tokens_per_slot)


def compressed_block_table(block_table: torch.Tensor, block_size: int, tokens_per_slot: int) -> torch.Tensor:
    """The block table of an entry with ``tokens_per_slot`` m (``[B, *]`` of the same blocks): entry w of a
    sequence sits in the block of its last token, ``block_table[b, ((w + 1) * m - 1) // block_size]``, at
    offset ``w % slots_per_block``. With m <= block_size (both powers of two) that is the token table
    itself; with m > block_size every (m / block_size)-th block, from the last of each group."""
    if tokens_per_slot <= block_size:
        return block_table
    step = tokens_per_slot // block_size
    return block_table[:, step - 1 :: step]


@dataclass(frozen=True)
class StateEntry:
    """A per-sequence state tensor: ``shape`` per sequence, ``dtype`` (None: the model's), ``init``
    (one of :data:`STATE_INITS`), ``shard`` (as :class:`PagedEntry`'s)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype | None = None
    init: str = "zeros"
    shard: Shard | None = None

    def __post_init__(self) -> None:
        if self.init not in STATE_INITS:
            raise ValueError(f"StateEntry '{self.name}': init must be one of {STATE_INITS}, got {self.init!r}")


CacheEntry = PagedEntry | StateEntry


class CachedLayer(nn.Module):
    """A layer with cache entries (attention, MLA, a recurrent layer).

    Subclasses return their entries from ``cache_spec()``. ``bind_cache`` receives one
    tensor per entry, by name, and stores each as an attribute of that name.
    ``per_token_states``: the layer's per-sequence state entries (if any) keep the state after each
    verified row (``Step.token_states``), so speculative decoding can continue from any of them; a
    model with a state entry in a layer without it cannot speculate.
    """

    per_token_states: bool = False

    def cache_spec(self) -> tuple[CacheEntry, ...]:
        """This layer's entries, in a stable order."""
        raise NotImplementedError

    def bind_cache(self, **tensors: torch.Tensor) -> None:
        for name, tensor in tensors.items():
            setattr(self, name, tensor)
