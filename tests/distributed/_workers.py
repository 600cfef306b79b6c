"""Rank bodies for the multi-process tests: module-level so that spawned interpreters can import them.

Each takes the rank's communicator first (``hetero.distributed.spawn`` calls ``fn(comm, *args)``)
and raises AssertionError on a wrong result, which spawn re-raises in the parent.
"""

from __future__ import annotations

import os
import time

import torch

import hetero
from hetero.errors import CommError

DIM_SPLITS = {2: [3, 0], 4: [2, 0, 5, 1]}


def _data(rank: int, shape, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randn(*shape, generator=g)


def collectives(comm) -> None:
    r, world = comm.rank, comm.world_size
    assert (r, world) == (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    xs = [_data(i, (4, 6)) for i in range(world)]
    x = xs[r]
    before = x.clone()
    torch.testing.assert_close(comm.all_reduce(x), sum(xs), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(comm.all_reduce(x, op="max"), torch.stack(xs).amax(0))
    torch.testing.assert_close(comm.all_reduce(x, op="min"), torch.stack(xs).amin(0))
    assert torch.equal(x, before), "all_reduce modified its input"
    for dim in (0, 1, -1):
        assert torch.equal(comm.all_gather(x, dim=dim), torch.cat(xs, dim=dim))
    # reduce_scatter: rank r gets chunk r of the sum
    big = [_data(i, (2 * world, 3 * world), seed=1) for i in range(world)]
    for dim in (0, 1):
        want = sum(big).chunk(world, dim=dim)[r]
        torch.testing.assert_close(comm.reduce_scatter(big[r], dim=dim), want, rtol=1e-6, atol=1e-6)
    # all_to_all with uneven and zero splits: rank s sends (s + d) % 3 rows (0, 1 or 2) to rank d
    sends = lambda s: [(s + d) % 3 for d in range(world)]  # noqa: E731
    rows = lambda s, d: torch.full((sends(s)[d], 5), 100.0 * s + d)  # noqa: E731
    x = torch.cat([rows(r, d) for d in range(world)])
    out_splits = [sends(s)[r] for s in range(world)]
    got = comm.all_to_all(x, out_splits, sends(r))
    assert torch.equal(got, torch.cat([rows(s, r) for s in range(world)]))
    # a rank that sends nothing at all, and int64 payloads
    idx = torch.arange(world, dtype=torch.int64).reshape(world, 1) + 10 * r
    none_from_0 = [0 if r == 0 else 1 for _ in range(world)]
    got = comm.all_to_all(idx[: sum(none_from_0)], [0] + [1] * (world - 1), none_from_0)
    assert got.tolist() == [[10 * s + r] for s in range(1, world)]
    # broadcast from the last rank
    src = world - 1
    got = comm.broadcast(_data(r, (3,)) if r == src else torch.zeros(3), src)
    assert torch.equal(got, _data(src, (3,)))
    comm.barrier()
    assert isinstance(hetero.load("cpu_ref").backend.communicator(), type(comm))


def dead_rank(comm, collective: str, result_dir: str, how: str = "exit") -> None:
    """The last rank leaves (how="exit") or stalls past the timeout (how="stall") before the
    collective; the others must raise CommError, not hang."""
    if comm.rank == comm.world_size - 1:
        if how == "stall":
            time.sleep(float(os.environ["HETERO_COMM_TIMEOUT"]) + 2)
        os._exit(0)  # gone without saying goodbye
    time.sleep(0.5)
    start = time.monotonic()
    try:
        if collective == "all_reduce":
            comm.all_reduce(torch.ones(4))
        elif collective == "all_to_all":
            comm.all_to_all(torch.ones(comm.world_size, 2), [1] * comm.world_size, [1] * comm.world_size)
        else:
            comm.barrier()
    except CommError as e:
        elapsed = time.monotonic() - start
        with open(os.path.join(result_dir, f"rank{comm.rank}.txt"), "w") as f:
            f.write(f"{elapsed}\n{e}\n")
        return
    raise AssertionError(f"{collective} returned although a rank was dead")


def ep_case(comm, case: dict) -> None:
    """ep_dispatch -> per-expert MLP on the local experts -> ep_combine equals fused_moe on the whole batch."""
    ref = hetero.load("cpu_ref")
    r, world = comm.rank, comm.world_size
    experts, top_k, hidden, inter = case["experts"], case["top_k"], case["hidden"], case["inter"]
    tokens = case["tokens"]  # per rank; a 0 is a rank with no tokens
    g = torch.Generator().manual_seed(case["seed"])
    total = sum(tokens)
    x_all = torch.randn(total, hidden, generator=g, dtype=torch.float32)
    logits = torch.randn(total, experts, generator=g) * 2
    w13 = torch.randn(experts, 2 * inter, hidden, generator=g) / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, generator=g) / inter**0.5
    bias = torch.randn(experts, generator=g) * 0.1 if case.get("n_group", 1) > 1 else None
    weights_all, ids_all = ref.route(
        logits,
        top_k=top_k,
        scoring=case.get("scoring", "softmax"),
        n_group=case.get("n_group", 1),
        topk_group=case.get("topk_group", 1),
        correction_bias=bias,
        routed_scaling_factor=case.get("scale", 1.0),
    )
    want_all = ref.fused_moe(x_all, w13, w2, weights_all, ids_all)

    lo = sum(tokens[:r])
    sl = slice(lo, lo + tokens[r])
    x, ids, weights = x_all[sl], ids_all[sl], weights_all[sl]
    backend = hetero.default_registry().load(case.get("backend", "cpu_ref"))
    d = backend.ep_dispatch(x, ids, weights, num_experts=experts, comm=comm)
    local = experts // world
    e0 = r * local
    assert d.group_ends.dtype == torch.int32 and d.group_ends.shape == (local,)
    assert d.x.shape[0] == d.weights.shape[0] == d.token_index.shape[0] == int(d.group_ends[-1])
    # every (token, local expert) pair on the whole batch arrives exactly once
    owned = ((ids_all.long() >= e0) & (ids_all.long() < e0 + local)).sum().item()
    assert d.x.shape[0] == owned, (d.x.shape, owned)
    # each token is sent once per rank that holds at least one of its experts
    sent = sum(len(set((ids[m].long() // local).tolist())) for m in range(ids.shape[0]))
    assert sum(d.send_splits) == sent

    h = ref.grouped_gemm(d.x, w13[e0 : e0 + local], d.group_ends)
    y_local = ref.grouped_gemm(ref.silu_and_mul(h), w2[e0 : e0 + local], d.group_ends)
    y = backend.ep_combine(y_local, d)
    assert y.shape == x.shape and y.dtype == x.dtype
    torch.testing.assert_close(y, want_all[sl], rtol=1e-5, atol=1e-5)
    comm.barrier()


def ep_bad_experts(comm) -> None:
    ref = hetero.load("cpu_ref")
    x = torch.randn(3, 8)
    ids = torch.zeros(3, 2, dtype=torch.int32)
    w = torch.ones(3, 2)
    try:
        ref.ep_dispatch(x, ids, w, num_experts=comm.world_size * 2 + 1, comm=comm)
    except hetero.OpError as e:
        assert "num_experts" in str(e) and "world size" in str(e)
    else:
        raise AssertionError("E % R != 0 was accepted")


def ep_cases(comm, cases: list) -> None:
    """Several EP cases in one spawn (process start-up dominates the test time)."""
    for case in cases:
        if case == "bad_experts":
            ep_bad_experts(comm)
        else:
            ep_case(comm, case)
