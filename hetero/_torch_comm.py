"""``TorchCommunicator``: the :class:`~hetero.spec.comm.Communicator` over a ``torch.distributed``
process group (its collectives and point-to-point transfer), and the collective timeout.
``hetero.distributed`` starts process groups and re-exports these;
backends construct communicators from here without importing it.
"""

from __future__ import annotations

import contextlib
import operator
import os
from datetime import timedelta
from typing import Any, Iterator, Sequence

import torch
import torch.distributed as dist

from hetero.errors import CommError
from hetero.spec.comm import REDUCE_OPS, Communicator

__all__ = ["TorchCommunicator", "comm_timeout", "DEFAULT_TIMEOUT_S", "TIMEOUT_ENV", "TIMEOUTS"]

#: Seconds a collective may wait for its peers unless told otherwise.
DEFAULT_TIMEOUT_S = 300.0
#: Environment variable overriding the default timeout (seconds).
TIMEOUT_ENV = "HETERO_COMM_TIMEOUT"

_REDUCE = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
#: The timeout each process group was created with (seconds), keyed by group (None = the default group).
TIMEOUTS: dict[Any, float] = {}


def comm_timeout(timeout: float | timedelta | None = None) -> float:
    """The collective timeout in seconds: the argument, else ``HETERO_COMM_TIMEOUT``, else 300."""
    if timeout is None:
        raw = os.environ.get(TIMEOUT_ENV, "").strip()
        if not raw:
            return DEFAULT_TIMEOUT_S
        try:
            timeout = float(raw)
        except ValueError:
            raise CommError("init", None, None, None, f"{TIMEOUT_ENV}={raw!r} is not a number of seconds") from None
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    timeout = float(timeout)
    if not timeout > 0:
        raise CommError("init", None, None, None, f"the timeout must be positive, got {timeout:g} s")
    return timeout


class TorchCommunicator(Communicator):
    """A :class:`~hetero.spec.comm.Communicator` over a ``torch.distributed`` process group.

    ``group=None`` is the default group, which must already be initialized
    (``hetero.distributed.init`` or ``torch.distributed.init_process_group``). ``device``: where
    ``recv`` puts what it receives (``Backend.communicator`` passes the backend's); None: the CPU on
    a gloo group, else the current accelerator.
    """

    def __init__(self, group: Any = None, *, timeout: float | None = None, device: torch.device | str | None = None):
        if not dist.is_available() or not dist.is_initialized():
            raise CommError(
                "communicator",
                None,
                None,
                timeout,
                "torch.distributed is not initialized; call hetero.distributed.init(backend) first "
                "(under torchrun, or with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set)",
            )
        self.group = group
        self._rank = dist.get_rank(group)
        self._world_size = dist.get_world_size(group)
        self.timeout = timeout if timeout is not None else TIMEOUTS.get(group, TIMEOUTS.get(None, comm_timeout()))
        self.device = torch.device(device) if device is not None else _group_device(group)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @contextlib.contextmanager
    def _collective(self, name: str) -> Iterator[None]:
        try:
            yield
        except CommError:
            raise
        except (
            RuntimeError,
            ConnectionError,
            TimeoutError,
        ) as e:  # DistBackendError, DistNetworkError are RuntimeErrors
            cause = " ".join(str(e).split())[:500] or type(e).__name__
            raise CommError(name, self._rank, self._world_size, self.timeout, cause) from e

    def _arg_error(self, name: str, what: str) -> CommError:
        return CommError(name, self._rank, self._world_size, self.timeout, f"bad argument: {what}")

    def all_reduce(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        if op not in _REDUCE:
            raise self._arg_error("all_reduce", f"op must be one of {', '.join(REDUCE_OPS)}, got {op!r}")
        out = x.detach().clone(memory_format=torch.contiguous_format)
        with self._collective("all_reduce"):
            dist.all_reduce(out, op=_REDUCE[op], group=self.group)
        return out

    def all_gather(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        dim = _dim(x, dim)
        src = x.movedim(dim, 0).contiguous()
        out = src.new_empty((src.shape[0] * self._world_size, *src.shape[1:]))
        with self._collective("all_gather"):
            dist.all_gather_into_tensor(out, src, group=self.group)
        return out.movedim(0, dim).contiguous()

    def reduce_scatter(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        dim = _dim(x, dim)
        if x.shape[dim] % self._world_size:
            raise self._arg_error(
                "reduce_scatter", f"x.shape[{dim}] = {x.shape[dim]} is not divisible by world size {self._world_size}"
            )
        src = x.movedim(dim, 0).contiguous()
        out = src.new_empty((src.shape[0] // self._world_size, *src.shape[1:]))
        with self._collective("reduce_scatter"):
            dist.reduce_scatter_tensor(out, src, op=dist.ReduceOp.SUM, group=self.group)
        return out.movedim(0, dim).contiguous()

    def all_to_all(self, x: torch.Tensor, out_splits: Sequence[int], in_splits: Sequence[int]) -> torch.Tensor:
        out_splits, in_splits = [int(s) for s in out_splits], [int(s) for s in in_splits]
        r = self._world_size
        if len(out_splits) != r or len(in_splits) != r:
            raise self._arg_error(
                "all_to_all", f"out_splits and in_splits need {r} entries, got {len(out_splits)} and {len(in_splits)}"
            )
        if min(out_splits + in_splits, default=0) < 0:
            raise self._arg_error("all_to_all", f"splits must be >= 0, got out {out_splits} in {in_splits}")
        if x.ndim == 0 or sum(in_splits) != x.shape[0]:
            raise self._arg_error("all_to_all", f"sum(in_splits) = {sum(in_splits)} != x.shape[0] ({list(x.shape)})")
        src = x.contiguous()
        out = src.new_empty((sum(out_splits), *src.shape[1:]))
        with self._collective("all_to_all"):
            dist.all_to_all_single(
                out, src, output_split_sizes=out_splits, input_split_sizes=in_splits, group=self.group
            )
        return out

    def broadcast(self, x: torch.Tensor, src: int) -> torch.Tensor:
        if not 0 <= int(src) < self._world_size:
            raise self._arg_error("broadcast", f"src must be in [0, {self._world_size}), got {src}")
        out = x.detach().clone(memory_format=torch.contiguous_format)
        global_src = dist.get_global_rank(self.group, src) if self.group is not None else int(src)
        with self._collective("broadcast"):
            dist.broadcast(out, global_src, group=self.group)
        return out

    def barrier(self) -> None:
        with self._collective("barrier"):
            if dist.get_backend(self.group) == "gloo":
                # gloo's barrier is an all_reduce; a monitored barrier honours the timeout and names a missing rank
                dist.monitored_barrier(group=self.group, timeout=timedelta(seconds=self.timeout), wait_all_ranks=True)
            else:
                dist.barrier(group=self.group)

    def send(self, x: torch.Tensor, dst: int) -> None:
        peer = self._peer("send", dst, "dst")
        if not isinstance(x, torch.Tensor):
            raise self._arg_error("send", f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.numel() == 0:  # both sides know the shape: nothing to carry
            return
        with self._collective("send"):
            self._wait(dist.isend(_bytes(x.detach().to(self.device)), peer, group=self.group))

    def recv(self, shape: Sequence[int], dtype: torch.dtype, src: int) -> torch.Tensor:
        peer = self._peer("recv", src, "src")
        if not isinstance(dtype, torch.dtype):
            raise self._arg_error("recv", f"dtype must be a torch.dtype, got {dtype!r}")
        try:
            dims = [operator.index(n) for n in shape]
        except TypeError:
            dims = [-1]
        if min(dims, default=0) < 0:
            raise self._arg_error("recv", f"shape must be a sequence of sizes >= 0, got {shape!r}")
        out = torch.empty(dims, dtype=dtype, device=self.device)
        if out.numel():
            with self._collective("recv"):
                self._wait(dist.irecv(_bytes(out), peer, group=self.group))
        return out

    def _peer(self, name: str, rank: Any, what: str) -> int:
        """The global rank of group rank ``rank``, which must be another rank of the group."""
        try:
            r = operator.index(rank)
        except TypeError:
            raise self._arg_error(name, f"{what} must be an int rank, got {type(rank).__name__}") from None
        if not 0 <= r < self._world_size:
            raise self._arg_error(name, f"{what} must be in [0, {self._world_size}), got {r}")
        if r == self._rank:
            raise self._arg_error(name, f"{what} {r} is this rank; point-to-point transfer needs another rank")
        return dist.get_global_rank(self.group, r) if self.group is not None else r

    def _wait(self, work: Any) -> None:
        # with a timeout: gloo stops waiting at it; NCCL/HCCL block this thread until the transfer
        # completes or times out, so a dead peer raises here rather than in the watchdog
        if not work.wait(timedelta(seconds=self.timeout)):
            raise RuntimeError("the transfer was aborted")


def _dim(x: torch.Tensor, dim: int) -> int:
    if not -x.ndim <= dim < x.ndim:
        raise CommError("collective", None, None, None, f"dim {dim} out of range for a {x.ndim}-D tensor")
    return dim % x.ndim


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """``t``'s memory as a flat uint8 view: every dtype travels as bytes (bool, fp8 and bf16 on any transport)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def _group_device(group: Any) -> torch.device:
    if dist.get_backend(group) == "gloo":
        return torch.device("cpu")
    accelerator = getattr(torch, "accelerator", None)
    current = accelerator.current_accelerator() if accelerator is not None else None
    return torch.device(current.type) if current is not None else torch.device("cpu")
