"""Point-to-point transfer (spec 1.12): the base class's tensor-dict protocol and its message for a
communicator written for an earlier spec, TorchCommunicator's send/recv on two gloo ranks with a
missing and a dead peer, and a planted bug that the ``--world-size`` tier catches."""

from __future__ import annotations

import json
from typing import Sequence

import _p2p_workers
import pytest
import torch

from hetero import Registry
from hetero.cli import main
from hetero.distributed import spawn
from hetero.errors import CommError
from hetero.spec.comm import Communicator


class Old(Communicator):
    """A communicator written for spec 1.11: collectives only."""

    def __init__(self, rank: int = 0):
        self._rank = rank

    rank = property(lambda self: self._rank)
    world_size = property(lambda self: 2)

    def all_reduce(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        return x.clone()

    def all_gather(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        return torch.cat([x, x], dim)

    def reduce_scatter(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        return x.chunk(2, dim)[self._rank].clone()

    def all_to_all(self, x: torch.Tensor, out_splits: Sequence[int], in_splits: Sequence[int]) -> torch.Tensor:
        return x.clone()

    def broadcast(self, x: torch.Tensor, src: int) -> torch.Tensor:
        return x.clone()

    def barrier(self) -> None:
        pass


class Mailbox(Old):
    """send/recv through a shared list, so the base class's tensor-dict protocol runs in one process."""

    def __init__(self, rank: int, box: list):
        super().__init__(rank)
        self.box = box

    def send(self, x: torch.Tensor, dst: int) -> None:
        self.box.append((self._rank, dst, x.clone()))

    def recv(self, shape, dtype, src: int) -> torch.Tensor:
        sender, dst, x = self.box.pop(0)
        assert (sender, dst, tuple(x.shape), x.dtype) == (src, self._rank, tuple(shape), dtype)
        return x


def test_a_communicator_of_an_earlier_spec_still_works_and_says_what_it_lacks():
    comm = Old()
    assert torch.equal(comm.all_reduce(torch.ones(2)), torch.ones(2))
    for call in (
        lambda: comm.send(torch.ones(2), 1),
        lambda: comm.recv((2,), torch.float32, 1),
        lambda: comm.send_tensor_dict({"x": torch.ones(2)}, 1),
        lambda: comm.recv_tensor_dict(1),
    ):
        with pytest.raises(
            NotImplementedError, match=r"Old has no point-to-point transfer \(point-to-point, spec 1.12\)"
        ):
            call()
    with pytest.raises(CommError, match="send_tensor_dict: .*bad argument: tensors must be a mapping"):
        comm.send_tensor_dict([torch.ones(2)], 1)


def test_tensor_dict_protocol_keeps_names_order_dtypes_and_shapes():
    box: list = []
    a, b = Mailbox(0, box), Mailbox(1, box)
    g = torch.Generator().manual_seed(7)
    sent = {
        "hidden_states": torch.randn(37, 64, generator=g).bfloat16(),
        "残差": torch.randn(37, 64, generator=g).half(),
        "positions": torch.randint(-(2**40), 2**40, (5,), generator=g),
        "mask": torch.rand(2, 3, generator=g) > 0.5,
        "scale": torch.randn((), generator=g),
        "empty": torch.empty(0, 8, dtype=torch.uint8),
    }
    a.send_tensor_dict(sent, 1)
    assert len(box) == 2 + len(sent)
    meta = json.loads(bytes(box[1][2].tolist()))
    assert meta[0] == ["hidden_states", "bfloat16", [37, 64]] and box[0][2].tolist() == [len(bytes(box[1][2].tolist()))]
    got = b.recv_tensor_dict(0)
    assert list(got) == list(sent) and not box
    for k, v in sent.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
    a.send_tensor_dict({}, 1)
    assert b.recv_tensor_dict(0) == {}
    a.send(torch.tensor([5]), 1)
    a.send(torch.frombuffer(bytearray(b"hello"), dtype=torch.uint8), 1)
    with pytest.raises(CommError, match="recv_tensor_dict: .*metadata b'hello' is not a send_tensor_dict's"):
        b.recv_tensor_dict(0)
    a.send(torch.tensor([-3]), 1)
    with pytest.raises(CommError, match="metadata of -3 bytes"):
        b.recv_tensor_dict(0)


SHORT = 1.0


def test_two_gloo_ranks_dtypes_dicts_bad_arguments_and_missing_and_dead_peers(tmp_path):
    spawn(_p2p_workers.two_ranks, 2, str(tmp_path), SHORT, env={"HETERO_COMM_TIMEOUT": "60"})
    for what in ("missing", "dead"):
        path = tmp_path / f"{what}.txt"
        assert path.exists(), f"the {what} peer's recv did not raise CommError"
        elapsed, message = path.read_text().split("\n", 1)
        print(f"{what} peer: CommError after {float(elapsed):.2f} s: {message.strip()[:300]}")
        assert float(elapsed) < 2 * SHORT + 1.0, (what, elapsed, message)
        rank = 1 if what == "missing" else 0
        assert message.startswith("recv: ") and f"rank {rank} of world size 2" in message, message
        assert f"timeout {SHORT:g} s" in message, message


DROPS_LAST_FLOAT = '''
import hetero
from hetero.distributed import TorchCommunicator
from hetero_cpu_ref.plugin import CpuRefBackend


class ZeroesLastFloat(TorchCommunicator):
    """recv zeroes the last element of a floating-point tensor (a transfer one element short)."""

    def recv(self, shape, dtype, src):
        out = super().recv(shape, dtype, src)
        if out.is_floating_point() and out.numel():
            out.view(-1)[-1] = 0
        return out


class Bad(CpuRefBackend):
    name = "zeroeslast"
    priority = -2000

    def communicator(self, group=None):
        return ZeroesLastFloat(group)


@hetero.hookimpl
def hetero_backends():
    return [Bad]
'''


def test_a_recv_that_loses_the_last_float_fails_every_case_with_a_float_payload(make_dist, tmp_path):
    make_dist("zeroeslast", DROPS_LAST_FLOAT)
    path = tmp_path / "r.json"
    argv = ["conformance", "zeroeslast", "--world-size", "2", "--quick", "-k", "send", "--timeout", "60"]
    assert main([*argv, "--json", str(path)], registry=Registry()) == 1
    status = {c["id"]: c["status"] for c in json.loads(path.read_text())["cases"]}
    with_floats = {i for i in status if any(d in i for d in ("float", "bfloat16", "pairs", "qwen3", "mixed/"))}
    with_floats -= {i for i in status if "no-tensors" in i or "peer-dies" in i}
    assert {i for i, s in status.items() if s != "pass"} == with_floats, status
    assert any("peer-dies" in i for i in status) and len(with_floats) >= 6, status
