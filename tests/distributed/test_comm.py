"""TorchCommunicator over gloo on 2 and 4 spawned ranks, init's errors, and a dead rank raising in time."""

from __future__ import annotations

import time

import _workers
import pytest
import torch.distributed as dist

import hetero
from hetero.distributed import TorchCommunicator, comm_timeout, init, spawn
from hetero.spec import OPS, Communicator


def test_communicator_is_a_type_not_an_op():
    assert "Communicator" not in OPS and "all_reduce" not in OPS
    assert issubclass(TorchCommunicator, Communicator)
    assert hetero.spec.Communicator is Communicator


@pytest.mark.parametrize("world_size", [2, 4])
def test_collectives(world_size):
    spawn(_workers.collectives, world_size)


def test_init_without_env_says_what_is_missing(monkeypatch):
    assert not dist.is_initialized()
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(hetero.CommError, match="RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set.*torchrun"):
        init("cpu_ref")
    with pytest.raises(hetero.CommError, match="not initialized"):
        hetero.load("cpu_ref").backend.communicator()


def test_timeout_from_argument_env_or_default(monkeypatch):
    monkeypatch.delenv("HETERO_COMM_TIMEOUT", raising=False)
    assert comm_timeout() == 300
    monkeypatch.setenv("HETERO_COMM_TIMEOUT", "7.5")
    assert comm_timeout() == 7.5 and comm_timeout(3) == 3
    monkeypatch.setenv("HETERO_COMM_TIMEOUT", "soon")
    with pytest.raises(hetero.CommError, match="HETERO_COMM_TIMEOUT"):
        comm_timeout()


TIMEOUT = 5.0


@pytest.mark.parametrize("collective,how", [("all_reduce", "exit"), ("barrier", "exit"), ("all_to_all", "stall")])
def test_dead_rank_raises_within_twice_the_timeout(collective, how, tmp_path):
    start = time.monotonic()
    spawn(_workers.dead_rank, 2, collective, str(tmp_path), how, env={"HETERO_COMM_TIMEOUT": str(TIMEOUT)})
    wall = time.monotonic() - start
    results = sorted(tmp_path.glob("rank*.txt"))
    assert [p.name for p in results] == ["rank0.txt"], wall
    for path in results:
        elapsed, message = path.read_text().split("\n", 1)
        print(f"{collective}/{how}: raised after {float(elapsed):.2f} s: {message.strip()[:300]}")
        assert float(elapsed) < 2 * TIMEOUT + 1.0, (collective, elapsed, message)
        assert f"{collective}:" in message and "of world size 2" in message and "timeout 5 s" in message, message
