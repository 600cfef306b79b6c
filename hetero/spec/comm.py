"""Collectives and point-to-point transfer: the ``Communicator`` type every backend hands out through
``Backend.communicator``.

This module declares a type, not operators: nothing here is in ``hetero.spec.OPS``.
A communicator spans ``world_size`` processes (ranks); every collective must be
called by every rank of its group, in the same order, with matching arguments.
Point-to-point transfer (spec 1.12: ``send``/``recv`` and ``send_tensor_dict``/
``recv_tensor_dict``) involves two ranks only, in an order their callers define.
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
import json
from typing import Mapping, Sequence

import torch

from hetero.errors import CommError

__all__ = ["Communicator", "REDUCE_OPS"]

#: The reductions ``all_reduce`` accepts.
REDUCE_OPS = ("sum", "max", "min")
#: Bytes of ``send_tensor_dict`` metadata a receiver accepts: more means the calls did not pair up.
_MAX_META = 1 << 24


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

    # ------------------------------------------------------------ point-to-point (spec 1.12)
    # Not abstract: a communicator written for spec 1.11 or earlier still loads and runs its
    # collectives; only a call of these raises.

    def send(self, x: torch.Tensor, dst: int) -> None:
        """Send ``x`` to rank ``dst``, which receives it with ``recv(x.shape, x.dtype, src=<this rank>)``.

        Pairwise and blocking; the callers define the order. A send may wait until ``dst`` has
        posted its recv, so order the calls so that neither rank first waits on what the other does
        after its call (a ring r -> r+1: rank 0 sends first, every other rank receives, then sends).
        Messages between two ranks arrive in the order they were sent.

        ``x``: any shape (0-dim and empty included), any dtype, on any device (copied to the
        backend's device first); it is left unchanged. ``dst`` in ``[0, world_size)`` and not this
        rank, else ``CommError`` (bad argument). Returns once ``x`` has been handed over to the
        transport, possibly before ``dst`` received it. A tensor without elements carries no data:
        the pair may skip the transfer. A send that cannot be handed over (the peer is dead, or does
        not receive within the timeout) raises ``CommError`` naming "send", the rank, the world size
        and the timeout, within about the timeout. After any CommError the communicator is unusable.
        """
        raise self._no_p2p("send")

    def recv(self, shape: Sequence[int], dtype: torch.dtype, src: int) -> torch.Tensor:
        """Receive the tensor rank ``src`` passes to ``send(x, dst=<this rank>)``.

        ``shape`` and ``dtype`` are those of the sender's ``x`` (the caller knows them; see
        ``recv_tensor_dict`` when it does not). Returns a new contiguous tensor on the backend's
        device, equal to ``x`` bit for bit. An empty ``shape`` (no elements) returns at once. A peer
        that is dead, or does not send within the timeout, raises ``CommError`` naming "recv", the
        rank, the world size and the timeout, within about the timeout: never a hang. ``src`` out of
        range or this rank, a negative size or a non-dtype raise ``CommError`` (bad argument).
        """
        raise self._no_p2p("recv")

    def send_tensor_dict(self, tensors: Mapping[str, torch.Tensor], dst: int) -> None:
        """Send named tensors (e.g. hidden states and residual between pipeline stages) to ``dst``.

        ``dst`` receives them with ``recv_tensor_dict(src=<this rank>)``, which needs no shapes.
        Built on ``send``: first the metadata, an int64 [1] byte count and a uint8 tensor of UTF-8
        JSON ``[[name, dtype, shape], ...]``, then every tensor in the mapping's order. Names are
        strings; values are tensors as ``send`` takes them (an empty mapping is legal). Anything
        else raises ``CommError`` (bad argument).
        """
        if not isinstance(tensors, Mapping):
            raise self._bad(
                "send_tensor_dict", f"tensors must be a mapping of str to Tensor, got {type(tensors).__name__}"
            )
        for k, v in tensors.items():
            if not isinstance(k, str) or not isinstance(v, torch.Tensor):
                raise self._bad(
                    "send_tensor_dict",
                    f"entry {k!r}: expected a str name and a Tensor, got {type(k).__name__} and {type(v).__name__}",
                )
        meta = [[k, str(v.dtype).removeprefix("torch."), list(v.shape)] for k, v in tensors.items()]
        raw = json.dumps(meta, separators=(",", ":")).encode()
        self.send(torch.tensor([len(raw)], dtype=torch.int64), dst)
        self.send(torch.frombuffer(bytearray(raw), dtype=torch.uint8), dst)
        for v in tensors.values():
            self.send(v, dst)

    def recv_tensor_dict(self, src: int) -> dict[str, torch.Tensor]:
        """Receive what rank ``src`` sent with ``send_tensor_dict``: a dict in the sender's order.

        Each tensor is as ``recv`` returns it (the backend's device, the sender's shape and dtype).
        Reading the metadata is a device-to-host copy. Metadata that is not a ``send_tensor_dict``'s
        (the two ranks' calls do not pair up) raises ``CommError``.
        """
        (size,) = self.recv((1,), torch.int64, src).tolist()
        if not 0 < size <= _MAX_META:
            raise self._bad("recv_tensor_dict", f"metadata of {size} bytes: the peer did not call send_tensor_dict")
        raw = bytes(self.recv((size,), torch.uint8, src).cpu().tolist())
        try:
            meta = [(str(k), _dtype(d), [int(n) for n in shape]) for k, d, shape in json.loads(raw.decode())]
        except (ValueError, TypeError) as e:
            raise self._bad("recv_tensor_dict", f"metadata {raw[:80]!r} is not a send_tensor_dict's: {e}") from None
        return {name: self.recv(shape, dtype, src) for name, dtype, shape in meta}

    def _no_p2p(self, name: str) -> NotImplementedError:
        return NotImplementedError(
            f"{name}: {type(self).__name__} has no point-to-point transfer (point-to-point, spec 1.12): "
            "it was written for an earlier spec; implement send and recv"
        )

    def _bad(self, name: str, what: str) -> CommError:
        reason = what if what.startswith("metadata") else f"bad argument: {what}"
        return CommError(name, self.rank, self.world_size, getattr(self, "timeout", None), reason)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} rank {self.rank} of {self.world_size}>"


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype")
    return dtype
