"""The distributed cases: each collective and ep_dispatch + expert MLP + ep_combine, judged on one rank.

Every rank draws its inputs from (seed, case, rank), so each one recomputes the
others' inputs and checks its own outputs against a single-process reference.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import torch

from hetero.verify.tolerances import tolerance
from hetero_conformance._dist_case import EXACT, DistCase, RankContext, Skip, check, unchanged
from hetero_conformance._dist_p2p import p2p_cases
from hetero_conformance._selectors import matches

__all__ = ["dist_cases", "selected_dist_cases", "EP_MODELS", "EP_HIDDEN", "EP_INTER"]


def _inputs(ctx: RankContext, case: DistCase, shape: Sequence[int]) -> list[torch.Tensor]:
    """Every rank's input (float32), as each rank draws its own."""
    return [torch.randn(*shape, generator=ctx.gen(case, r)) for r in range(ctx.world)]


def _dev(ctx: RankContext, t: torch.Tensor) -> torch.Tensor:
    return t.to(ctx.ops.device)


def _all_reduce(ctx: RankContext, case: DistCase):
    red, shape = case.param("op"), case.param("shape")
    xs = _inputs(ctx, case, shape)
    x = _dev(ctx, xs[ctx.rank])
    before = x.cpu().clone()
    got = ctx.comm.all_reduce(x, op=red)
    problems: list[str] = []
    report: dict[str, Any] = {}
    unchanged("x", x, before, problems)
    stack = torch.stack(xs)
    if red == "sum":
        oracle, ref = stack.double().sum(0), stack.sum(0)
        check("out", got.cpu(), oracle, ref, tolerance("float32"), report, problems)
    else:
        want = stack.amax(0) if red == "max" else stack.amin(0)
        check("out", got.cpu(), want, None, EXACT, report, problems)
    return problems, report


def _all_gather(ctx: RankContext, case: DistCase):
    dim, per = case.param("dim"), case.param("shape")
    xs = _inputs(ctx, case, per)
    x = _dev(ctx, xs[ctx.rank])
    before = x.cpu().clone()
    got = ctx.comm.all_gather(x, dim=dim)
    problems: list[str] = []
    report: dict[str, Any] = {}
    unchanged("x", x, before, problems)
    check("out", got.cpu(), torch.cat(xs, dim=dim), None, EXACT, report, problems)
    return problems, report


def _reduce_scatter(ctx: RankContext, case: DistCase):
    dim, chunk = case.param("dim"), case.param("shape")
    shape = list(chunk)
    shape[dim] *= ctx.world
    xs = _inputs(ctx, case, shape)
    x = _dev(ctx, xs[ctx.rank])
    before = x.cpu().clone()
    got = ctx.comm.reduce_scatter(x, dim=dim)
    problems: list[str] = []
    report: dict[str, Any] = {}
    unchanged("x", x, before, problems)
    stack = torch.stack(xs)
    oracle = stack.double().sum(0).chunk(ctx.world, dim=dim)[ctx.rank]
    ref = stack.sum(0).chunk(ctx.world, dim=dim)[ctx.rank]
    check("out", got.cpu(), oracle.contiguous(), ref.contiguous(), tolerance("float32"), report, problems)
    return problems, report


def _splits(kind: str, src: int, world: int) -> list[int]:
    """Rows rank ``src`` sends to each rank: uneven (some zero), or nothing to and from rank 0."""
    if kind == "uneven":
        return [(src + 2 * d) % 3 + (1 if src == d else 0) * 2 for d in range(world)]
    return [0 if (d == 0 or src == 0) else 1 + (src * d) % 3 for d in range(world)]


def _all_to_all(ctx: RankContext, case: DistCase):
    kind, cols = case.param("splits"), case.param("cols")
    sends = [_splits(kind, s, ctx.world) for s in range(ctx.world)]
    xs = [torch.randn(sum(sends[s]), cols, generator=ctx.gen(case, s)) for s in range(ctx.world)]
    in_splits = sends[ctx.rank]
    out_splits = [sends[s][ctx.rank] for s in range(ctx.world)]
    x = _dev(ctx, xs[ctx.rank])
    before = x.cpu().clone()
    got = ctx.comm.all_to_all(x, out_splits, in_splits)
    want = torch.cat([xs[s].split(sends[s])[ctx.rank] for s in range(ctx.world)])
    problems: list[str] = []
    report: dict[str, Any] = {}
    unchanged("x", x, before, problems)
    check("out", got.cpu(), want, None, EXACT, report, problems)
    return problems, report


def _broadcast(ctx: RankContext, case: DistCase):
    src = case.param("src") % ctx.world
    xs = _inputs(ctx, case, case.param("shape"))
    x = _dev(ctx, xs[ctx.rank])
    before = x.cpu().clone()
    got = ctx.comm.broadcast(x, src)
    problems: list[str] = []
    report: dict[str, Any] = {}
    unchanged("x", x, before, problems)
    check("out", got.cpu(), xs[src], None, EXACT, report, problems)
    return problems, report


def _barrier(ctx: RankContext, case: DistCase):
    """Each rank marks its arrival (late ranks later), passes the barrier, then must see every mark."""
    marks = ctx.scratch / f"barrier-{case.seed(ctx.seed)}"
    marks.mkdir(parents=True, exist_ok=True)
    time.sleep(0.05 * ctx.rank)
    (marks / str(ctx.rank)).touch()
    ctx.comm.barrier()
    missing = [r for r in range(ctx.world) if not (marks / str(r)).exists()]
    problems = [f"returned before rank(s) {missing} reached the barrier"] if missing else []
    return problems, {}


# ---------------------------------------------------------------- expert parallelism

#: name: (experts, top_k, route kwargs); hidden and intermediate shrunk, expert counts real.
EP_MODELS = {
    "qwen3-30b-a3b": (128, 8, dict(scoring="softmax", renormalize=True)),
    "deepseek-v3": (
        256,
        8,
        dict(scoring="sigmoid", renormalize=True, n_group=8, topk_group=4, routed_scaling_factor=2.5),
    ),
}
EP_HIDDEN, EP_INTER = 64, 32


def _ep_tokens(case: DistCase, rank: int, world: int) -> int:
    t = case.param("tokens")
    return 0 if case.param("empty_rank") and rank == world - 1 else t + rank % 2


def _ep_rank_inputs(ctx: RankContext, case: DistCase, rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s x [T, H], and its routing (weights, ids) from the reference ``route``."""
    e, k, kw = EP_MODELS[case.param("model")]
    gen = ctx.gen(case, rank)
    t = _ep_tokens(case, rank, ctx.world)
    x = torch.randn(t, EP_HIDDEN, generator=gen)
    logits = torch.randn(t, e, generator=gen) * 1.5
    extra = {}
    if "n_group" in kw:
        extra["correction_bias"] = (
            torch.rand(e, generator=torch.Generator().manual_seed(case.seed(ctx.seed))) - 0.5
        ) * 0.1
    weights, ids = ctx.reference.route(logits, top_k=k, **kw, **extra)
    return x, weights, ids


def _dispatch_problems(d: Any, all_ids: torch.Tensor, lo: int, local: int) -> list[str]:
    """What is wrong with ep_dispatch's rows and group_ends for this rank's experts [lo, lo + local)."""
    problems = []
    want_pairs = int(((all_ids.long() >= lo) & (all_ids.long() < lo + local)).sum())
    if d.x.shape[0] != want_pairs:
        problems.append(f"ep_dispatch gave this rank {d.x.shape[0]} (token, expert) rows, expected {want_pairs}")
    in_range = all_ids.long().reshape(-1)
    counts = torch.bincount(in_range[(in_range >= lo) & (in_range < lo + local)] - lo, minlength=local)
    if not torch.equal(d.group_ends.cpu().long(), counts.cumsum(0)):
        problems.append(f"ep_dispatch group_ends {d.group_ends.cpu().tolist()} != {counts.cumsum(0).tolist()}")
    return problems


def _ep(ctx: RankContext, case: DistCase):
    e, k, _ = EP_MODELS[case.param("model")]
    if e % ctx.world:
        raise Skip(f"{e} experts cannot be split evenly over {ctx.world} ranks")
    wgen = torch.Generator().manual_seed(case.seed(ctx.seed) + 1)
    w13 = torch.randn(e, 2 * EP_INTER, EP_HIDDEN, generator=wgen) / EP_HIDDEN**0.5
    w2 = torch.randn(e, EP_HIDDEN, EP_INTER, generator=wgen) / EP_INTER**0.5
    every = [_ep_rank_inputs(ctx, case, r) for r in range(ctx.world)]
    x, weights, ids = every[ctx.rank]
    local = e // ctx.world
    lo = ctx.rank * local
    ops, dev = ctx.ops, ctx.ops.device

    xd, wd, idd = x.to(dev), weights.to(dev), ids.to(dev)
    before = x.clone()
    d = ops.ep_dispatch(xd, idd, wd, num_experts=e, comm=ctx.comm)
    w13l, w2l = w13[lo : lo + local].to(dev), w2[lo : lo + local].to(dev)
    h = ops.grouped_gemm(d.x, w13l, d.group_ends)
    y = ops.grouped_gemm(ops.silu_and_mul(h), w2l, d.group_ends)
    got = ops.ep_combine(y, d)

    problems: list[str] = []
    report: dict[str, Any] = {}
    unchanged("x", xd, before, problems)
    all_ids = torch.cat([ids for _, _, ids in every])
    problems += _dispatch_problems(d, all_ids, lo, local)

    xs = torch.cat([a for a, _, _ in every])
    ws = torch.cat([b for _, b, _ in every])
    start = sum(_ep_tokens(case, r, ctx.world) for r in range(ctx.rank))
    rows = slice(start, start + x.shape[0])
    ref = ctx.reference.fused_moe(xs, w13, w2, ws, all_ids)[rows]
    try:
        oracle = ctx.reference.fused_moe(xs.double(), w13.double(), w2.double(), ws, all_ids)[rows]
    except Exception:  # a reference without float64: its float32 result is the oracle
        oracle = ref.double()
    check("out", got.cpu(), oracle, ref, tolerance("float32"), report, problems)
    return problems, report


def dist_cases(world: int, *, quick: bool = False) -> list[DistCase]:
    """The cases of a ``world``-rank run (the same list on every rank)."""
    w = f"world{world}"
    out = [
        DistCase("all_reduce", "comm", f"{w}.sum.7x33", _all_reduce, (("op", "sum"), ("shape", (7, 33)))),
        DistCase("all_reduce", "comm", f"{w}.max.5x9", _all_reduce, (("op", "max"), ("shape", (5, 9)))),
        DistCase(
            "all_reduce", "comm", f"{w}.sum.1x1024", _all_reduce, (("op", "sum"), ("shape", (1, 1024))), quick=False
        ),
        DistCase("all_gather", "comm", f"{w}.dim0.5x6", _all_gather, (("dim", 0), ("shape", (5, 6)))),
        DistCase("all_gather", "comm", f"{w}.dim1.3x7", _all_gather, (("dim", 1), ("shape", (3, 7)))),
        DistCase("reduce_scatter", "comm", f"{w}.dim0.3x5", _reduce_scatter, (("dim", 0), ("shape", (3, 5)))),
        DistCase("reduce_scatter", "comm", f"{w}.dim1.4x2", _reduce_scatter, (("dim", 1), ("shape", (4, 2)))),
        DistCase("all_to_all", "comm", f"{w}.uneven.c6", _all_to_all, (("splits", "uneven"), ("cols", 6))),
        DistCase("all_to_all", "comm", f"{w}.rank0-empty.c3", _all_to_all, (("splits", "rank0-empty"), ("cols", 3))),
        DistCase("broadcast", "comm", f"{w}.src0.4x5", _broadcast, (("src", 0), ("shape", (4, 5)))),
        DistCase("broadcast", "comm", f"{w}.last.6", _broadcast, (("src", -1), ("shape", (6,)))),
        DistCase("barrier", "comm", f"{w}", _barrier),
        DistCase(
            "ep_dispatch+ep_combine", "moe", f"{w}.qwen3-30b-a3b.t5", _ep, (("model", "qwen3-30b-a3b"), ("tokens", 5))
        ),
        DistCase(
            "ep_dispatch+ep_combine", "moe", f"{w}.deepseek-v3.t4", _ep, (("model", "deepseek-v3"), ("tokens", 4))
        ),
        DistCase(
            "ep_dispatch+ep_combine",
            "moe",
            f"{w}.qwen3-30b-a3b.t3.last-rank-empty",
            _ep,
            (("model", "qwen3-30b-a3b"), ("tokens", 3), ("empty_rank", True)),
        ),
        DistCase(
            "ep_dispatch+ep_combine",
            "moe",
            f"{w}.deepseek-v3.t16",
            _ep,
            (("model", "deepseek-v3"), ("tokens", 16)),
            quick=False,
        ),
        *p2p_cases(world),  # last: its final case lets a rank die
    ]
    return [c for c in out if c.quick or not quick]


def selected_dist_cases(world: int, *, quick: bool, patterns: Sequence[str]) -> list[DistCase]:
    """The cases of a ``world``-rank run whose id matches one of ``patterns`` (none: all)."""
    return [c for c in dist_cases(world, quick=quick) if not patterns or any(matches(c.id, p) for p in patterns)]
