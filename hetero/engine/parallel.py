"""Tensor and expert parallelism: who this process is, and the explicit collectives layers call."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hetero.spec.comm import Communicator

__all__ = ["Parallel", "divide"]


def divide(n: int, parts: int, what: str) -> int:
    """``n / parts``, or a ValueError naming what could not be split."""
    if n % parts:
        raise ValueError(f"{what} ({n}) is not divisible by the tensor-parallel size ({parts})")
    return n // parts


@dataclass(frozen=True)
class Parallel:
    """The tensor-parallel group of this process (size 1: no communicator, collectives are identities).

    Attention heads and MLP columns/rows are split over the group; with
    ``expert_parallel`` the MoE experts are split over the same ranks instead of
    their intermediate dimension, and tokens reach their experts through
    ``ep_dispatch`` / ``ep_combine``.
    """

    comm: Communicator | None = None
    expert_parallel: bool = False

    @property
    def rank(self) -> int:
        return self.comm.rank if self.comm is not None else 0

    @property
    def size(self) -> int:
        return self.comm.world_size if self.comm is not None else 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.size == 1 else self.comm.all_reduce(x)

    def all_gather(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        return x if self.size == 1 else self.comm.all_gather(x, dim=dim)

    def broadcast(self, x: torch.Tensor, src: int = 0) -> torch.Tensor:
        return x if self.size == 1 else self.comm.broadcast(x, src)
