"""Expert-parallel dispatch and combine, written once over a Communicator in device-agnostic torch.

Both the reference backend and TritonBackend bind these: the work is two
``all_to_all`` exchanges (plus one of counts) and index bookkeeping, which any
device runs as torch ops; the expert MLP between them is the backend's own.

Expert ids are range-checked by ``hetero.spec.validate.ep_dispatch`` when validation is on
(the reference always checks them). Unchecked, an id outside [0, E) matches no rank, so its pair
is dropped on the device and no torch index sees it (on a GPU a bad index is a device-side
assert that kills the context).
"""

from __future__ import annotations

import torch

from hetero.spec.checks import INDEX_DTYPES, check_same_device, check_tensor, expect
from hetero.spec.comm import Communicator
from hetero.spec.types import FLOAT_DTYPES, EPDispatch

__all__ = ["check_dispatch", "ep_dispatch", "ep_combine"]


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """[N, ...] -> uint8 [N, bytes per row] (a view when contiguous)."""
    cols = 1
    for size in t.shape[1:]:
        cols *= size
    return t.contiguous().reshape(t.shape[0], cols).view(torch.uint8)


def _from_bytes(b: torch.Tensor, dtype: torch.dtype, cols: int) -> torch.Tensor:
    return b.contiguous().view(dtype).reshape(b.shape[0], cols)


def check_dispatch(x: object, ids: object, weights: object, num_experts: object, comm: object) -> None:
    """The arguments of ep_dispatch, less the ids' values (hetero.spec.validate.ep_dispatch)."""
    op = "ep_dispatch"
    expect(isinstance(comm, Communicator), op, "comm", "a hetero.spec.Communicator", type(comm).__name__)
    check_tensor(op, "x", x, ndim=2, dtypes=FLOAT_DTYPES)
    expect(
        isinstance(num_experts, int) and not isinstance(num_experts, bool) and num_experts >= 1,
        op,
        "num_experts",
        "an int >= 1",
        repr(num_experts),
    )
    world = comm.world_size
    expect(num_experts % world == 0, op, "num_experts", f"a multiple of the world size {world}", num_experts)
    check_tensor(op, "ids", ids, shape=(x.shape[0], None), dtypes=INDEX_DTYPES)
    check_tensor(op, "weights", weights, dtypes=(torch.float32,), shape=(x.shape[0], ids.shape[1]))
    check_same_device(op, x=x, ids=ids, weights=weights)


def ep_dispatch(
    x: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    *,
    num_experts: int,
    comm: Communicator,
) -> EPDispatch:
    check_dispatch(x, ids, weights, num_experts, comm)
    world, _rank, k = comm.world_size, comm.rank, ids.shape[1]
    m, hidden, device = x.shape[0], x.shape[1], x.device
    local = num_experts // world

    ids_l = ids.long()
    dest = ids_l // local  # [M, k] the rank of each pair's expert; in [0, R) exactly when the id is in [0, E),
    # so an out-of-range id matches no rank below: its pair is dropped on the device, no index faults
    rank_ids = torch.arange(world, device=device)
    need = (dest.unsqueeze(-1) == rank_ids).any(dim=1)  # [M, R]: does rank d hold one of token m's experts
    dst_rank, send_index = need.t().nonzero(as_tuple=True)  # grouped by destination rank, tokens ascending
    send_counts = torch.bincount(dst_rank, minlength=world)
    # each sent row carries the token, its k weights and its local expert ids on that rank (-1: not there)
    lids = torch.where(
        dest[send_index] == dst_rank.unsqueeze(1),
        ids_l[send_index] - dst_rank.unsqueeze(1) * local,
        torch.full_like(ids_l[send_index], -1),
    ).to(torch.int32)

    recv_counts = comm.all_to_all(send_counts.reshape(world, 1), [1] * world, [1] * world).reshape(world)
    send_splits = tuple(int(c) for c in send_counts.tolist())
    recv_splits = tuple(int(c) for c in recv_counts.tolist())

    payload = torch.cat([_as_bytes(x[send_index]), _as_bytes(weights[send_index]), _as_bytes(lids)], dim=1)
    got = comm.all_to_all(payload, recv_splits, send_splits)
    xb = hidden * x.element_size()
    rx = _from_bytes(got[:, :xb], x.dtype, hidden)
    rw = _from_bytes(got[:, xb : xb + 4 * k], torch.float32, k)
    rl = _from_bytes(got[:, xb + 4 * k :], torch.int32, k).long()

    # expand to (token, local expert) pairs, stably grouped by local expert
    flat = rl.reshape(-1)
    pair = ((flat >= 0) & (flat < local)).nonzero(as_tuple=True)[0]  # -1: not on this rank
    order = torch.sort(flat[pair], stable=True).indices
    pair = pair[order]
    token_index = pair // max(k, 1)
    group_ends = torch.cumsum(torch.bincount(flat[pair], minlength=local), 0).to(torch.int32)
    return EPDispatch(
        x=rx[token_index],
        group_ends=group_ends,
        weights=rw.reshape(-1)[pair],
        token_index=token_index,
        recv_splits=recv_splits,
        send_splits=send_splits,
        send_index=send_index,
        num_tokens=m,
        num_experts=num_experts,
        comm=comm,
    )


def ep_combine(y_local: torch.Tensor, dispatch: EPDispatch) -> torch.Tensor:
    op = "ep_combine"
    expect(
        isinstance(dispatch, EPDispatch),
        op,
        "dispatch",
        "the EPDispatch returned by ep_dispatch",
        type(dispatch).__name__,
    )
    check_tensor(op, "y_local", y_local, ndim=2, dtypes=FLOAT_DTYPES, shape=(dispatch.x.shape[0], None))
    check_same_device(op, y_local=y_local, token_index=dispatch.token_index)
    hidden = y_local.shape[1]
    acc = torch.float64 if y_local.dtype == torch.float64 else torch.float32
    received = sum(dispatch.recv_splits)
    partial = torch.zeros(received, hidden, dtype=acc, device=y_local.device)
    partial.index_add_(0, dispatch.token_index, y_local.to(acc) * dispatch.weights.to(acc).unsqueeze(1))
    back = dispatch.comm.all_to_all(partial, dispatch.send_splits, dispatch.recv_splits)
    out = torch.zeros(dispatch.num_tokens, hidden, dtype=acc, device=y_local.device)
    out.index_add_(0, dispatch.send_index, back)
    return out.to(y_local.dtype)
