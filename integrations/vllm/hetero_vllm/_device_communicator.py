"""``HeteroDeviceCommunicator``: vLLM's device communicator on hetero's ``Communicator``.

``HeteroDevicePlatform.get_device_communicator_cls()`` names this class. vLLM builds one per
process group of more than one rank (``GroupCoordinator``), with the group's ``device_group``,
a ``torch.distributed`` group of the platform's ``dist_backend`` (the hetero backend's: nccl,
hccl, ...). The collectives go to the communicator the hetero backend hands out for that group
(``Backend.communicator(device_group)``, a ``hetero.distributed.TorchCommunicator`` unless the
backend overrides it), so a failed or timed-out collective raises hetero's ``CommError``
naming the collective, the rank and the timeout. Where hetero has no such call (``gather``,
the variable-size and all-to-all forms), and on a group torch.distributed does not know
(vLLM's stateless groups), vLLM's ``DeviceCommunicatorBase`` serves as it is.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.distributed.device_communicators.base_device_communicator import DeviceCommunicatorBase

__all__ = ["HeteroDeviceCommunicator"]


def _known_group(group: Any) -> bool:
    """Whether torch.distributed registered ``group``; vLLM's stateless groups are not (no ``dist.*`` call works
    on them), and ``DeviceCommunicatorBase`` tells them apart the same way."""
    from torch.distributed.distributed_c10d import _world

    return _world.pg_map.get(group, None) is not None


def _hetero_communicator(group: Any) -> Any:
    """The communicator the hetero backend this process routes to hands out for ``group``."""
    from hetero_vllm import _backend

    return _backend.ops().backend.communicator(group)


class HeteroDeviceCommunicator(DeviceCommunicatorBase):
    """A ``DeviceCommunicatorBase`` whose all_reduce, all_gather, reduce_scatter, broadcast, send and recv run on
    hetero's communicator over ``device_group`` (``hetero``, None where vLLM's base class serves instead)."""

    def __init__(
        self,
        cpu_group: Any,
        device: torch.device | None = None,
        device_group: Any = None,
        unique_name: str = "",
        global_ranks: list[int] | None = None,
        global_world_size: int | None = None,
        use_all2all: bool = False,
    ):
        super().__init__(cpu_group, device, device_group, unique_name, global_ranks, global_world_size, use_all2all)
        #: hetero's ``Communicator`` over ``device_group``; None: no device group, or a stateless one.
        self.hetero = (
            _hetero_communicator(device_group)
            if device_group is not None and _known_group(device_group) and _known_group(cpu_group)
            else None
        )

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        """The sum over the group's ranks, as a new tensor (vLLM's callers take the returned one)."""
        if self.hetero is None:
            return super().all_reduce(input_)
        return self.hetero.all_reduce(input_, "sum")

    def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's ``input_`` concatenated along ``dim``, in rank order."""
        if self.hetero is None:
            return super().all_gather(input_, dim)
        return self.hetero.all_gather(input_, dim)

    def reduce_scatter(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """The sum over the group's ranks, this rank's chunk of it along ``dim``."""
        if self.hetero is None or self.world_size == 1:
            return super().reduce_scatter(input_, dim)
        return self.hetero.reduce_scatter(input_, dim)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Rank ``src``'s ``tensor`` (a rank of this group) written into ``tensor`` on every rank, and returned."""
        if self.hetero is None or self.world_size == 1:
            return super().broadcast(tensor, src)
        # vLLM's contract is in place; hetero's broadcast returns a new tensor
        return tensor.copy_(self.hetero.broadcast(tensor, src))

    def send(self, tensor: torch.Tensor, dst: int | None = None) -> None:
        """Send ``tensor`` to group rank ``dst`` (None: the next rank); the peer must receive with ``recv``."""
        if self.hetero is None:
            return super().send(tensor, dst)
        self.hetero.send(tensor, (self.rank_in_group + 1) % self.world_size if dst is None else dst)

    def recv(self, size: torch.Size, dtype: torch.dtype, src: int | None = None) -> torch.Tensor:
        """A tensor of ``size`` and ``dtype`` from group rank ``src`` (None: the previous rank)."""
        if self.hetero is None:
            return super().recv(size, dtype, src)
        return self.hetero.recv(size, dtype, (self.rank_in_group - 1) % self.world_size if src is None else src)
