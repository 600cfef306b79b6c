"""The point-to-point cases (spec 1.12): ``send``/``recv`` and ``send_tensor_dict``/``recv_tensor_dict``.

Every rank draws every rank's tensors from (seed, case, rank), so a receiver knows what it must
get. The tensors go around a ring (rank r sends to r+1; rank 0 sends first, every other rank
receives first, so blocking calls cannot deadlock) and between pairs (0, 1), (2, 3), ...
Received tensors are compared bit for bit, and they must be on the backend's device. The last
case is a peer that dies: the last rank leaves the run and every other rank's ``recv`` from it
must raise ``CommError`` instead of hanging; it must stay the last case of a run.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from hetero.errors import CommError
from hetero_conformance._dist_case import EXACT, DistCase, RankContext, Skip, check, unchanged

__all__ = ["p2p_cases", "QWEN3_8B_HIDDEN"]

#: Qwen3-8B's hidden size: the hidden states and residual a pipeline stage hands to the next.
QWEN3_8B_HIDDEN = 4096


def _draw(gen: torch.Generator, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """Fresh random values of ``dtype`` (never zeros only: a dropped transfer shows)."""
    if dtype.is_floating_point:
        return (torch.randn(tuple(shape), generator=gen) * 3).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, tuple(shape), generator=gen).bool()
    if dtype == torch.uint8:
        return torch.randint(0, 256, tuple(shape), generator=gen).to(dtype)
    return torch.randint(-(2**40), 2**40, tuple(shape), generator=gen).to(dtype)


def _entries(ctx: RankContext, case: DistCase, rank: int) -> dict[str, torch.Tensor]:
    """What rank ``rank`` sends in ``case``: its tensors by name, in order."""
    gen = ctx.gen(case, rank)
    return {name: _draw(gen, shape, getattr(torch, dtype)) for name, shape, dtype in case.param("tensors")}


def _judge(ctx: RankContext, got: dict[str, Any], want: dict[str, torch.Tensor], report: dict, problems: list) -> None:
    if list(got) != list(want):
        problems.append(f"received names {list(got)}, expected {list(want)}")
        return
    for name, w in want.items():
        g = got[name]
        if not isinstance(g, torch.Tensor):
            problems.append(f"'{name}' is a {type(g).__name__}, not a tensor")
            continue
        if g.device.type != ctx.ops.device.type:
            problems.append(f"'{name}' arrived on {g.device}, not on the backend's device {ctx.ops.device}")
        check(name, g.cpu(), w, None, EXACT, report, problems)


def _ring(ctx: RankContext, case: DistCase):
    """Rank r sends its tensors to r+1 and receives r-1's; dicts or one ``send`` per tensor."""
    if ctx.world < 2:
        raise Skip("point-to-point transfer needs two ranks")
    whole = case.param("dict", False)
    nxt, prv = (ctx.rank + 1) % ctx.world, (ctx.rank - 1) % ctx.world
    mine = {k: v.to(ctx.ops.device) for k, v in _entries(ctx, case, ctx.rank).items()}
    before = {k: v.cpu().clone() for k, v in mine.items()}
    want = _entries(ctx, case, prv)

    def send() -> None:
        if whole:
            ctx.comm.send_tensor_dict(mine, nxt)
        else:
            for v in mine.values():
                ctx.comm.send(v, nxt)

    def recv() -> dict[str, Any]:
        if whole:
            return ctx.comm.recv_tensor_dict(prv)
        return {k: ctx.comm.recv(w.shape, w.dtype, prv) for k, w in want.items()}

    if ctx.rank == 0:
        send()
        got = recv()
    else:
        got = recv()
        send()
    problems: list[str] = []
    report: dict[str, Any] = {}
    for k, v in mine.items():
        unchanged(k, v, before[k], problems)
    _judge(ctx, got, want, report, problems)
    return problems, report


def _pairs(ctx: RankContext, case: DistCase):
    """Pairs (0, 1), (2, 3), ...: the lower rank sends all its tensors in order, then receives the
    upper rank's; the upper receives first. A last rank without a partner sits the case out."""
    lower = ctx.rank - ctx.rank % 2
    peer = ctx.rank + 1 if ctx.rank == lower else lower
    if peer >= ctx.world:
        return [], {}
    mine = {k: v.to(ctx.ops.device) for k, v in _entries(ctx, case, ctx.rank).items()}
    want = _entries(ctx, case, peer)

    def recv() -> dict[str, torch.Tensor]:
        return {k: ctx.comm.recv(w.shape, w.dtype, peer) for k, w in want.items()}

    if ctx.rank == lower:
        for v in mine.values():
            ctx.comm.send(v, peer)
        got = recv()
    else:
        got = recv()
        for v in mine.values():
            ctx.comm.send(v, peer)
    problems: list[str] = []
    report: dict[str, Any] = {}
    _judge(ctx, got, want, report, problems)
    return problems, report


def _peer_dies(ctx: RankContext, case: DistCase):
    """After a barrier the last rank leaves (its run ends with this case and its process exits);
    every other rank's recv from it must raise CommError naming recv, its rank and the world size."""
    if ctx.world < 2 or not ctx.spawned:
        raise Skip("needs spawned ranks: under torchrun the ranks gather their results after the last case")
    ctx.comm.barrier()  # every earlier transfer has landed before the peer goes
    gone = ctx.world - 1
    if ctx.rank == gone:
        return [], {}
    try:
        got = ctx.comm.recv((3, 5), torch.float32, gone)
    except CommError as e:
        text = str(e)
        where = f"rank {ctx.rank} of world size {ctx.world}"
        problems = [] if text.startswith("recv:") and where in text else [f"CommError does not name recv and {where}"]
        return problems, {}
    except Exception as e:  # any other exception is the finding
        return [f"recv from a rank that died raised {type(e).__name__}, not CommError: {e}"], {}
    return [f"recv from rank {gone}, which died, returned a {list(got.shape)} tensor instead of raising"], {}


#: name: the tensors of each rank, (name, shape, dtype name).
_SHAPES: dict[str, tuple[tuple[str, tuple[int, ...], str], ...]] = {
    "float32.3x5x7": (("x", (3, 5, 7), "float32"),),
    "bfloat16.37x64": (("x", (37, 64), "bfloat16"),),
    "float16.0d+2x3": (("scalar", (), "float16"), ("x", (2, 3), "float16")),
    "int64.11": (("x", (11,), "int64"),),
    "bool.4x9": (("x", (4, 9), "bool"),),
    "uint8.empty+16": (("empty", (0, 16), "uint8"), ("x", (16,), "uint8")),
}
_QWEN3_8B = (
    ("hidden_states", (37, QWEN3_8B_HIDDEN), "bfloat16"),
    ("residual", (37, QWEN3_8B_HIDDEN), "bfloat16"),
)
_MIXED = (
    ("positions", (5,), "int64"),
    ("mask", (2, 3), "bool"),
    ("scale", (), "float32"),
    ("empty", (0, 8), "float16"),
    ("ids", (4,), "uint8"),
)


def p2p_cases(world: int) -> list[DistCase]:
    """The point-to-point cases of a ``world``-rank run; the dying peer comes last."""
    w = f"world{world}"
    sr, td = "send+recv", "send_tensor_dict+recv_tensor_dict"
    out = [
        DistCase(sr, "comm", f"{w}.ring.{name.split('.', 1)[1]}", _ring, (("tensors", t),), dtype=name.split(".")[0])
        for name, t in _SHAPES.items()
    ]
    out += [
        DistCase(
            sr,
            "comm",
            f"{w}.pairs.in-order",
            _pairs,
            (("tensors", _MIXED[:2] + _SHAPES["bfloat16.37x64"]),),
            dtype="mixed",
        ),
        DistCase(
            td,
            "comm",
            f"{w}.ring.qwen3-8b.t37",
            _ring,
            (("tensors", _QWEN3_8B), ("dict", True)),
            dtype="bfloat16",
        ),
        DistCase(td, "comm", f"{w}.ring.mixed", _ring, (("tensors", _MIXED), ("dict", True)), dtype="mixed"),
        DistCase(td, "comm", f"{w}.ring.no-tensors", _ring, (("tensors", ()), ("dict", True)), dtype="mixed"),
        DistCase(sr, "comm", f"{w}.peer-dies", _peer_dies),
    ]
    return out
