"""Tensor and expert parallelism: who this process is, and the explicit collectives layers call."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

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

    def broadcast_object(self, obj: Any, device: torch.device, src: int = 0) -> Any:
        """``obj`` (picklable; ignored on ranks other than ``src``) as rank ``src`` has it, on every rank.

        Two broadcasts through the communicator (length, then bytes), on ``device``:
        the engine's step plan and outputs travel this way under TP.
        """
        if self.size == 1:
            return obj
        payload = pickle.dumps(obj) if self.rank == src else b""
        length = self.comm.broadcast(torch.tensor([len(payload)], dtype=torch.int64, device=device), src)
        data = (
            torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
            if self.rank == src
            else torch.empty(int(length.item()), dtype=torch.uint8, device=device)
        )
        data = self.comm.broadcast(data, src)
        return obj if self.rank == src else pickle.loads(data.cpu().numpy().tobytes())
