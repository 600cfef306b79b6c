"""Collectives: the ``Communicator`` type every backend hands out through ``Backend.communicator``.

This module declares a type, not operators: nothing here is in ``hetero.spec.OPS``.
A communicator spans ``world_size`` processes (ranks); every collective must be
called by every rank of its group, in the same order, with matching arguments.
Tensors live on the backend's device. Every method returns a new tensor and
leaves its input unchanged. A collective that fails (a peer died, or did not
arrive within the communicator's timeout) raises ``hetero.errors.CommError``
naming the collective, the rank, the world size and the timeout; it never hangs
past about the timeout.

Launching many processes or hosts is torchrun's job; hetero never writes its
own transport. ``hetero.distributed.TorchCommunicator`` implements this type
over a ``torch.distributed`` process group of the backend's ``dist_backend``.
"""

from __future__ import annotations

import abc
from typing import Sequence

import torch

__all__ = ["Communicator", "REDUCE_OPS"]

#: The reductions ``all_reduce`` accepts.
REDUCE_OPS = ("sum", "max", "min")


class Communicator(abc.ABC):
    """A group of ``world_size`` ranks and the collectives between them."""

    @property
    @abc.abstractmethod
    def rank(self) -> int:
        """This process's rank in the group, in ``[0, world_size)``."""

    @property
    @abc.abstractmethod
    def world_size(self) -> int:
        """The number of ranks in the group (>= 1)."""

    @abc.abstractmethod
    def all_reduce(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Elementwise reduction of ``x`` over all ranks; every rank gets the result.

        ``op`` is one of ``REDUCE_OPS`` ("sum", "max", "min"). ``x`` has the same
        shape and dtype on every rank. Returns a tensor of x's shape and dtype.
        """

    @abc.abstractmethod
    def all_gather(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Concatenate every rank's ``x`` along ``dim``, in rank order; every rank gets the result.

        ``x`` has the same shape on every rank; the result has ``world_size`` times
        its size along ``dim``.
        """

    @abc.abstractmethod
    def reduce_scatter(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Sum ``x`` over all ranks, then give rank r the r-th of ``world_size`` equal chunks along ``dim``.

        ``x.shape[dim]`` must be divisible by ``world_size``; ``x`` has the same
        shape on every rank.
        """

    @abc.abstractmethod
    def all_to_all(self, x: torch.Tensor, out_splits: Sequence[int], in_splits: Sequence[int]) -> torch.Tensor:
        """Exchange row blocks along dim 0: rank r sends ``in_splits[d]`` rows of ``x`` to each rank d.

        ``x`` [sum(in_splits), ...] holds the blocks for ranks 0, 1, ... in order;
        ``in_splits`` and ``out_splits`` have ``world_size`` entries. The result
        [sum(out_splits), ...] holds the ``out_splits[s]`` rows received from each
        rank s, in rank order; ``out_splits[s]`` on rank r must equal
        ``in_splits[r]`` on rank s. Uneven and zero splits are legal (a rank may
        send or receive nothing). Trailing dims and dtype are the same on every rank.
        """

    @abc.abstractmethod
    def broadcast(self, x: torch.Tensor, src: int) -> torch.Tensor:
        """Every rank gets rank ``src``'s ``x``; the other ranks pass a tensor of the same shape and dtype."""

    @abc.abstractmethod
    def barrier(self) -> None:
        """Return once every rank of the group has reached this call."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} rank {self.rank} of {self.world_size}>"
