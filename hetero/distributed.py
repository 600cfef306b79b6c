"""Collectives over ``torch.distributed``: the ``TorchCommunicator`` (``hetero._torch_comm``), ``init`` from torchrun's
environment, and ``spawn`` to run a function on N local ranks (tests, conformance).

hetero has no transport of its own: every collective is one ``torch.distributed``
call on a process group of the backend's ``dist_backend`` (gloo, nccl, hccl).
Failures are raised as :class:`hetero.errors.CommError`, naming the collective,
rank, world size and timeout.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from hetero._torch_comm import DEFAULT_TIMEOUT_S, TIMEOUT_ENV, TIMEOUTS, TorchCommunicator, comm_timeout
from hetero.errors import CommError
from hetero.registry import default_registry

__all__ = [
    "TorchCommunicator",
    "init",
    "subgroup",
    "spawn",
    "free_port",
    "comm_timeout",
    "DEFAULT_TIMEOUT_S",
    "TIMEOUT_ENV",
]

_REQUIRED_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _dist_backend(backend: Any) -> tuple[str, Any]:
    """The process-group backend name and the hetero Backend class for a Backend class/instance, a name or None."""
    if callable(getattr(backend, "process_group_backend", None)):  # a Backend class or instance
        cls = backend if isinstance(backend, type) else type(backend)
        return cls.process_group_backend(), cls
    if backend is not None and not isinstance(backend, str):
        raise CommError(
            "init",
            None,
            None,
            None,
            f"backend must be a hetero Backend, its class, a name or None, got {type(backend).__name__}",
        )
    registry = default_registry()
    name = backend if backend is not None else registry.select()
    cls = registry.entry(name).cls
    if cls is None:
        raise CommError("init", None, None, None, f"hetero backend '{name}' could not be loaded")
    return cls.process_group_backend(), cls


def init(backend: Any = None, *, timeout: float | timedelta | None = None) -> TorchCommunicator:
    """Start the default process group from torchrun's environment and return its communicator.

    ``backend``: a hetero Backend (class or instance) or a registered name; None selects one as
    ``hetero.load()`` would. Its ``dist_backend`` names the process-group backend. Reads RANK,
    WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and LOCAL_RANK, to pick the device on accelerators).
    ``timeout`` (seconds), else ``HETERO_COMM_TIMEOUT``, else 300: how long a collective may wait.
    If the default group is already initialized, returns a communicator over it.
    """
    seconds = comm_timeout(timeout)
    if dist.is_initialized():
        return TorchCommunicator(None, timeout=TIMEOUTS.get(None, seconds))
    missing = [k for k in _REQUIRED_ENV if not os.environ.get(k)]
    if missing:
        raise CommError(
            "init",
            None,
            None,
            seconds,
            f"environment variable(s) {', '.join(missing)} not set; launch with torchrun "
            f"(e.g. `torchrun --nproc-per-node 2 script.py`) or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT",
        )
    try:
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError as e:
        raise CommError("init", None, None, seconds, f"RANK, WORLD_SIZE and LOCAL_RANK must be integers: {e}") from None
    pg_backend, cls = _dist_backend(backend)
    if pg_backend != "gloo":
        module = getattr(torch, cls.device_type, None)
        if module is not None and hasattr(module, "set_device"):
            module.set_device(local_rank)
    try:
        dist.init_process_group(
            backend=pg_backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=seconds)
        )
    except (RuntimeError, ValueError, ConnectionError, TimeoutError) as e:
        raise CommError(
            "init",
            rank,
            world_size,
            seconds,
            f"init_process_group({pg_backend!r}) at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} "
            f"failed: {e}",
        ) from e
    TIMEOUTS[None] = seconds
    return TorchCommunicator(None, timeout=seconds)


def subgroup(comm: TorchCommunicator, groups: list[list[int]]) -> TorchCommunicator:
    """A communicator over the one of ``groups`` (disjoint lists of ``comm``'s ranks) that holds this rank.

    Collective over ``comm``: every rank creates every group, in the same order (``new_group``'s rule).
    The new group keeps ``comm``'s timeout and device."""
    if not isinstance(comm, TorchCommunicator):
        raise CommError("subgroup", None, None, None, f"needs a TorchCommunicator, got {type(comm).__name__}")
    mine = None
    for ranks in groups:
        group = dist.new_group(ranks, timeout=timedelta(seconds=comm.timeout))
        if comm.rank in ranks:
            mine = group
    if mine is None:
        raise CommError("subgroup", comm.rank, comm.world_size, comm.timeout, f"rank {comm.rank} is in no group")
    TIMEOUTS[mine] = comm.timeout
    return TorchCommunicator(mine, timeout=comm.timeout, device=comm.device)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (for a local rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _spawned(
    local_rank: int,
    fn: Callable,
    world_size: int,
    port: int,
    backend: Any,
    timeout: float | None,
    env: dict[str, str],
    args: tuple,
) -> None:
    os.environ.update(env)
    os.environ.update(
        RANK=str(local_rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    comm = init(backend, timeout=timeout)
    try:
        fn(comm, *args)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(
    fn: Callable[..., None],
    world_size: int,
    *args: Any,
    backend: Any = "cpu_ref",
    timeout: float | None = None,
    env: dict[str, str] | None = None,
) -> None:
    """Run ``fn(comm, *args)`` on ``world_size`` local processes, each with a communicator from ``init``.

    ``fn`` must be importable by a fresh interpreter (a module-level function; start method
    "spawn"). Rendezvous over a free TCP port on 127.0.0.1. ``env`` is set in every rank before
    ``init``. An exception in any rank is re-raised here (``torch.multiprocessing.ProcessRaisedException``).
    """
    import torch.multiprocessing as mp

    port = free_port()
    mp.spawn(
        _spawned,
        args=(fn, world_size, port, backend, timeout, dict(env or {}), args),
        nprocs=world_size,
        join=True,
        start_method="spawn",
    )
