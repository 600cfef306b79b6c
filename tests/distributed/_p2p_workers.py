"""Rank bodies for tests/distributed/test_p2p.py: module-level so that spawned interpreters import them."""

from __future__ import annotations

import os
import time

import torch

from hetero.distributed import TorchCommunicator
from hetero.errors import CommError

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.bool, torch.uint8)


def payload(rank: int) -> list[torch.Tensor]:
    """What ``rank`` sends: every dtype, a 0-dim, an empty and a non-contiguous tensor."""
    g = torch.Generator().manual_seed(100 + rank)
    out = []
    for i, dtype in enumerate(DTYPES):
        v = torch.randn(3, 2 + i, generator=g) * 50
        out.append(v > 0 if dtype == torch.bool else v.to(dtype))
    out += [torch.randn((), generator=g), torch.empty(0, 5), torch.randn(4, 6, generator=g).t()]
    return out


def _raises(fn, *words: str) -> None:
    try:
        fn()
    except CommError as e:
        assert all(w in str(e) for w in words), (words, str(e))
        return
    raise AssertionError(f"no CommError mentioning {words}")


def two_ranks(comm, result_dir: str, short: float) -> None:
    """Send/recv both ways, a tensor dict, bad arguments; then a missing and a dead peer."""
    r, peer = comm.rank, 1 - comm.rank
    assert comm.device == torch.device("cpu")
    mine, theirs = payload(r), payload(peer)
    before = [t.clone() for t in mine]

    def recv_all() -> list[torch.Tensor]:
        return [comm.recv(t.shape, t.dtype, peer) for t in theirs]

    if r == 0:  # rank 0 sends first, rank 1 receives first: blocking calls pair up
        for t in mine:
            comm.send(t, peer)
        got = recv_all()
    else:
        got = recv_all()
        for t in mine:
            comm.send(t, peer)
    for g, want in zip(got, theirs):
        assert g.dtype == want.dtype and g.shape == want.shape and g.is_contiguous(), (g.dtype, g.shape)
        assert torch.equal(g, want), want.dtype
    assert all(torch.equal(a, b) for a, b in zip(mine, before)), "send modified its input"

    hidden = {"hidden_states": theirs[1], "residual": theirs[1] * 2}
    if r == 1:
        comm.send_tensor_dict({"hidden_states": mine[1], "residual": mine[1] * 2}, peer)
    else:
        got = comm.recv_tensor_dict(peer)
        assert list(got) == ["hidden_states", "residual"]
        assert all(torch.equal(got[k], v) and got[k].dtype == torch.bfloat16 for k, v in hidden.items())

    _raises(lambda: comm.send(torch.ones(2), r), "send:", "bad argument", "is this rank")
    _raises(lambda: comm.send(torch.ones(2), 2), "send:", "dst must be in [0, 2), got 2")
    _raises(lambda: comm.send([1.0, 2.0], peer), "send:", "torch.Tensor, got list")
    _raises(lambda: comm.recv((2, -1), torch.float32, peer), "recv:", "sizes >= 0")
    _raises(lambda: comm.recv((2,), "float32", peer), "recv:", "torch.dtype")
    _raises(lambda: comm.recv((2,), torch.float32, 0.5), "recv:", "int rank")
    _raises(lambda: comm.send_tensor_dict({"a": [1]}, peer), "send_tensor_dict:", "bad argument")
    assert comm.recv((0, 3), torch.int64, peer).shape == (0, 3)  # nothing to carry: no peer needed
    comm.barrier()

    # rank 1 waits on rank 0, which is missing (asleep), past the short timeout, then leaves;
    # rank 0 wakes up and receives from rank 1, which is dead by then
    fast = TorchCommunicator(None, timeout=short)
    what = "missing" if r == 1 else "dead"
    if r == 0:
        time.sleep(short + 0.5)
    start = time.monotonic()
    try:
        fast.recv((4, 4), torch.float32, peer)
    except CommError as e:
        with open(os.path.join(result_dir, f"{what}.txt"), "w") as f:
            f.write(f"{time.monotonic() - start}\n{e}\n")
    if r == 1:
        os._exit(0)  # gone without saying goodbye
