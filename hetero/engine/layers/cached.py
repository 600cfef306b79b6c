"""Layers that keep per-sequence state between steps, and how they declare it.

A cached layer lists its entries once (``cache_spec``); the runtime allocates
each kind into its own pool and binds the tensors before the first step:

- a :class:`PagedEntry` is per-token (attention's K and V, MLA's latent): one
  tensor ``[num_blocks, block_size, *shape]``, addressed by ``Step.slot_mapping``
  and the block tables of ``Step.meta``;
- a :class:`StateEntry` is per-sequence (a recurrent state, a running
  summary): one tensor ``[num_state_slots, *shape]``, addressed by
  ``Step.state_slots``; a sequence owns one slot from admission to its end.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["CachedLayer", "PagedEntry", "StateEntry", "CacheEntry", "STATE_INITS"]

#: How a state slot starts: "zeros", zeroed by the runtime when a sequence gets it;
#: "flag", left as it is, the layer reading ``Step.has_initial_state`` instead.
STATE_INITS = ("zeros", "flag")


@dataclass(frozen=True)
class PagedEntry:
    """A per-token cache tensor: ``shape`` per token, ``dtype`` (None: the model's), ``fill`` at allocation.

    The default NaN fill makes a read of a slot nobody wrote show up in the output.
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype | None = None
    fill: float = float("nan")


@dataclass(frozen=True)
class StateEntry:
    """A per-sequence state tensor: ``shape`` per sequence, ``dtype`` (None: the model's), ``init``
    (one of :data:`STATE_INITS`)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype | None = None
    init: str = "zeros"

    def __post_init__(self) -> None:
        if self.init not in STATE_INITS:
            raise ValueError(f"StateEntry '{self.name}': init must be one of {STATE_INITS}, got {self.init!r}")


CacheEntry = PagedEntry | StateEntry


class CachedLayer(nn.Module):
    """A layer with cache entries (attention, MLA, a recurrent layer).

    Subclasses return their entries from ``cache_spec()``. ``bind_cache`` receives one
    tensor per entry, by name, and stores each as an attribute of that name.
    """

    def cache_spec(self) -> tuple[CacheEntry, ...]:
        """This layer's entries, in a stable order."""
        raise NotImplementedError

    def bind_cache(self, **tensors: torch.Tensor) -> None:
        for name, tensor in tensors.items():
            setattr(self, name, tensor)
