"""``hetero conformance NAME --world-size N``: the collectives and expert parallelism on N ranks.

The parent spawns N ranks (``torch.multiprocessing``, start method "spawn";
rendezvous through a FileStore in a temporary directory). Each rank loads backend
NAME, initializes the default process group with the backend's ``dist_backend``,
takes ``backend.communicator()`` and runs the same list of cases in the same
order. Every rank draws its inputs from (seed, case, rank), so each one can
recompute the others' inputs and check its own outputs against a single-process
reference:

* ``all_reduce`` (sum, max), ``all_gather`` and ``reduce_scatter`` (dim 0 and 1),
  ``all_to_all`` (uneven and zero splits), ``broadcast``, ``barrier``;
* ``ep_dispatch`` + the rank's expert MLP (``grouped_gemm``, ``silu_and_mul``,
  ``grouped_gemm`` of the backend) + ``ep_combine``, against the reference
  ``fused_moe`` on the concatenated batch (float64 oracle, float32 reference and
  the float32 tolerance of ``tolerances.py``).

Each rank appends one JSON line per case to its own file; the parent merges the
lines into one CaseResult per case (failing if any rank failed, naming it). A
rank that dies is reported as ``crashed``; when no rank finishes a case within
``timeout`` seconds the ranks are killed and the unfinished cases are ``timeout``.

Under torchrun (``torchrun --nproc-per-node 2 -m hetero_conformance.distributed cpu_ref``)
the ranks use torchrun's environment instead, and rank 0 gathers the results and
prints the summary.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from hetero_conformance.metrics import compare
from hetero_conformance.runner import CaseResult
from hetero_conformance.tolerances import Tolerance, tolerance

__all__ = ["DistCase", "dist_cases", "run_distributed", "run_rank", "main"]

EXACT = Tolerance(0.0, 0.0, "pure data movement: every element must be copied bit for bit")
_POLL_S = 0.05


@dataclass(frozen=True)
class DistCase:
    """One distributed check: ``fn(ctx, case)`` returns this rank's (problems, outputs report)."""

    op: str
    family: str
    shape: str
    fn: Callable[["RankContext", "DistCase"], tuple[list[str], dict[str, Any]]]
    params: tuple[tuple[str, Any], ...] = ()
    quick: bool = True
    dtype: str = "float32"

    @property
    def id(self) -> str:
        return f"{self.op}/{self.shape}/{self.dtype}"

    def param(self, key: str, default: Any = None) -> Any:
        return dict(self.params).get(key, default)

    def seed(self, base: int) -> int:
        return (base * 1_000_003 + sum(map(ord, self.id)) * 7919 + len(self.id)) % (2**62)


@dataclass
class RankContext:
    ops: Any
    reference: Any
    comm: Any
    rank: int
    world: int
    seed: int
    scratch: Path

    def gen(self, case: DistCase, rank: int) -> torch.Generator:
        return torch.Generator().manual_seed(case.seed(self.seed) * 131 + rank)


# ---------------------------------------------------------------- verdicts

def _check(name: str, got: torch.Tensor, oracle: torch.Tensor, ref: torch.Tensor | None, tol: Tolerance,
           report: dict[str, Any], problems: list[str]) -> None:
    """The runner's rule: max_abs <= 2 x reference + floor x scale, rel_l2 <= bound; exact when tol is EXACT."""
    if tuple(got.shape) != tuple(oracle.shape) or got.dtype != (ref.dtype if ref is not None else oracle.dtype):
        want_dtype = ref.dtype if ref is not None else oracle.dtype
        problems.append(f"'{name}' is {str(got.dtype).removeprefix('torch.')}{list(got.shape)}, "
                        f"expected {str(want_dtype).removeprefix('torch.')}{list(oracle.shape)}")
        return
    if tol is EXACT:
        mismatched = int((~((got.cpu() == oracle.cpu()) | (got.cpu().isnan() & oracle.cpu().isnan()))).sum())
        report[name] = {"kind": "exact", "mismatched": mismatched, "numel": oracle.numel()}
        if mismatched:
            problems.append(f"'{name}': {mismatched} of {oracle.numel()} elements differ (exact)")
        return
    m = compare(got, oracle)
    r = compare(ref, oracle) if ref is not None else compare(oracle, oracle)
    bound = 2 * r.max_abs + tol.floor * m.scale
    report[name] = {"kind": "float", **m.as_dict(), "ref_max_abs": r.max_abs, "ref_rel_l2": r.rel_l2,
                    "bound_max_abs": bound, "bound_rel_l2": tol.max_rel_l2}
    if m.nonfinite_mismatch:
        problems.append(f"'{name}': {m.nonfinite_mismatch} elements NaN/Inf where the oracle is not (or the reverse)")
    if m.max_abs > bound:
        problems.append(f"'{name}': max abs error {m.max_abs:.3g} > bound {bound:.3g} (2 x reference {r.max_abs:.3g} + floor)")
    if m.rel_l2 > tol.max_rel_l2:
        problems.append(f"'{name}': relative L2 error {m.rel_l2:.3g} > {tol.max_rel_l2:.3g}")


def _unchanged(name: str, x: torch.Tensor, before: torch.Tensor, problems: list[str]) -> None:
    if not torch.equal(x.cpu(), before):
        problems.append(f"modified its input '{name}'")


# ---------------------------------------------------------------- collectives

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
    _unchanged("x", x, before, problems)
    stack = torch.stack(xs)
    if red == "sum":
        oracle, ref = stack.double().sum(0), stack.sum(0)
        _check("out", got.cpu(), oracle, ref, tolerance("all_reduce", "float32"), report, problems)
    else:
        want = stack.amax(0) if red == "max" else stack.amin(0)
        _check("out", got.cpu(), want, None, EXACT, report, problems)
    return problems, report


def _all_gather(ctx: RankContext, case: DistCase):
    dim, per = case.param("dim"), case.param("shape")
    xs = _inputs(ctx, case, per)
    x = _dev(ctx, xs[ctx.rank])
    before = x.cpu().clone()
    got = ctx.comm.all_gather(x, dim=dim)
    problems: list[str] = []
    report: dict[str, Any] = {}
    _unchanged("x", x, before, problems)
    _check("out", got.cpu(), torch.cat(xs, dim=dim), None, EXACT, report, problems)
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
    _unchanged("x", x, before, problems)
    stack = torch.stack(xs)
    oracle = stack.double().sum(0).chunk(ctx.world, dim=dim)[ctx.rank]
    ref = stack.sum(0).chunk(ctx.world, dim=dim)[ctx.rank]
    _check("out", got.cpu(), oracle.contiguous(), ref.contiguous(), tolerance("reduce_scatter", "float32"), report, problems)
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
    _unchanged("x", x, before, problems)
    _check("out", got.cpu(), want, None, EXACT, report, problems)
    return problems, report


def _broadcast(ctx: RankContext, case: DistCase):
    src = case.param("src") % ctx.world
    xs = _inputs(ctx, case, case.param("shape"))
    x = _dev(ctx, xs[ctx.rank])
    before = x.cpu().clone()
    got = ctx.comm.broadcast(x, src)
    problems: list[str] = []
    report: dict[str, Any] = {}
    _unchanged("x", x, before, problems)
    _check("out", got.cpu(), xs[src], None, EXACT, report, problems)
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
    "deepseek-v3": (256, 8, dict(scoring="sigmoid", renormalize=True, n_group=8, topk_group=4, routed_scaling_factor=2.5)),
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
        extra["correction_bias"] = (torch.rand(e, generator=torch.Generator().manual_seed(case.seed(ctx.seed))) - 0.5) * 0.1
    weights, ids = ctx.reference.route(logits, top_k=k, **kw, **extra)
    return x, weights, ids


class Skip(Exception):
    """The case does not apply to this world size."""


def _ep(ctx: RankContext, case: DistCase):
    e, k, _ = EP_MODELS[case.param("model")]
    if e % ctx.world:
        raise Skip(f"{e} experts cannot be split evenly over {ctx.world} ranks")
    wgen = torch.Generator().manual_seed(case.seed(ctx.seed) + 1)
    w13 = torch.randn(e, 2 * EP_INTER, EP_HIDDEN, generator=wgen) / EP_HIDDEN ** 0.5
    w2 = torch.randn(e, EP_HIDDEN, EP_INTER, generator=wgen) / EP_INTER ** 0.5
    every = [_ep_rank_inputs(ctx, case, r) for r in range(ctx.world)]
    x, weights, ids = every[ctx.rank]
    local = e // ctx.world
    lo = ctx.rank * local
    ops, dev = ctx.ops, ctx.ops.device

    xd, wd, idd = x.to(dev), weights.to(dev), ids.to(dev)
    before = x.clone()
    d = ops.ep_dispatch(xd, idd, wd, num_experts=e, comm=ctx.comm)
    w13l, w2l = w13[lo:lo + local].to(dev), w2[lo:lo + local].to(dev)
    h = ops.grouped_gemm(d.x, w13l, d.group_ends)
    y = ops.grouped_gemm(ops.silu_and_mul(h), w2l, d.group_ends)
    got = ops.ep_combine(y, d)

    problems: list[str] = []
    report: dict[str, Any] = {}
    _unchanged("x", xd, before, problems)
    all_ids = torch.cat([ids for _, _, ids in every])
    want_pairs = int(((all_ids.long() >= lo) & (all_ids.long() < lo + local)).sum())
    if d.x.shape[0] != want_pairs:
        problems.append(f"ep_dispatch gave this rank {d.x.shape[0]} (token, expert) rows, expected {want_pairs}")
    in_range = all_ids.long().reshape(-1)
    counts = torch.bincount(in_range[(in_range >= lo) & (in_range < lo + local)] - lo, minlength=local)
    if not torch.equal(d.group_ends.cpu().long(), counts.cumsum(0)):
        problems.append(f"ep_dispatch group_ends {d.group_ends.cpu().tolist()} != {counts.cumsum(0).tolist()}")

    xs = torch.cat([a for a, _, _ in every])
    ws = torch.cat([b for _, b, _ in every])
    start = sum(_ep_tokens(case, r, ctx.world) for r in range(ctx.rank))
    rows = slice(start, start + x.shape[0])
    ref = ctx.reference.fused_moe(xs, w13, w2, ws, all_ids)[rows]
    try:
        oracle = ctx.reference.fused_moe(xs.double(), w13.double(), w2.double(), ws, all_ids)[rows]
    except Exception:  # a reference without float64: its float32 result is the oracle
        oracle = ref.double()
    _check("out", got.cpu(), oracle, ref, tolerance("fused_moe", "float32"), report, problems)
    return problems, report


def dist_cases(world: int, *, quick: bool = False) -> list[DistCase]:
    """The cases of a ``world``-rank run (the same list on every rank)."""
    w = f"world{world}"
    out = [
        DistCase("all_reduce", "comm", f"{w}.sum.7x33", _all_reduce, (("op", "sum"), ("shape", (7, 33)))),
        DistCase("all_reduce", "comm", f"{w}.max.5x9", _all_reduce, (("op", "max"), ("shape", (5, 9)))),
        DistCase("all_reduce", "comm", f"{w}.sum.1x1024", _all_reduce, (("op", "sum"), ("shape", (1, 1024))), quick=False),
        DistCase("all_gather", "comm", f"{w}.dim0.5x6", _all_gather, (("dim", 0), ("shape", (5, 6)))),
        DistCase("all_gather", "comm", f"{w}.dim1.3x7", _all_gather, (("dim", 1), ("shape", (3, 7)))),
        DistCase("reduce_scatter", "comm", f"{w}.dim0.3x5", _reduce_scatter, (("dim", 0), ("shape", (3, 5)))),
        DistCase("reduce_scatter", "comm", f"{w}.dim1.4x2", _reduce_scatter, (("dim", 1), ("shape", (4, 2)))),
        DistCase("all_to_all", "comm", f"{w}.uneven.c6", _all_to_all, (("splits", "uneven"), ("cols", 6))),
        DistCase("all_to_all", "comm", f"{w}.rank0-empty.c3", _all_to_all, (("splits", "rank0-empty"), ("cols", 3))),
        DistCase("broadcast", "comm", f"{w}.src0.4x5", _broadcast, (("src", 0), ("shape", (4, 5)))),
        DistCase("broadcast", "comm", f"{w}.last.6", _broadcast, (("src", -1), ("shape", (6,)))),
        DistCase("barrier", "comm", f"{w}", _barrier),
        DistCase("ep_dispatch+ep_combine", "moe", f"{w}.qwen3-30b-a3b.t5", _ep, (("model", "qwen3-30b-a3b"), ("tokens", 5))),
        DistCase("ep_dispatch+ep_combine", "moe", f"{w}.deepseek-v3.t4", _ep, (("model", "deepseek-v3"), ("tokens", 4))),
        DistCase("ep_dispatch+ep_combine", "moe", f"{w}.qwen3-30b-a3b.t3.last-rank-empty", _ep,
                 (("model", "qwen3-30b-a3b"), ("tokens", 3), ("empty_rank", True))),
        DistCase("ep_dispatch+ep_combine", "moe", f"{w}.deepseek-v3.t16", _ep, (("model", "deepseek-v3"), ("tokens", 16)), quick=False),
    ]
    return [c for c in out if c.quick or not quick]


def _result(case: DistCase, status: str, message: str = "", seed: int = 0, **kw: Any) -> CaseResult:
    return CaseResult(case.id, case.op, case.family, case.shape, case.dtype, status, message, seed, **kw)


# ---------------------------------------------------------------- one rank

def _load(name: str) -> tuple[Any, Any]:
    import hetero
    from hetero.registry import REFERENCE, default_registry

    registry = default_registry()
    return hetero.load(name), registry.entry(REFERENCE).cls()


def run_rank(name: str, rank: int, world: int, *, seed: int, quick: bool, patterns: Sequence[str], scratch: Path,
             emit: Callable[[dict[str, Any]], None]) -> None:
    """Run every case on this rank (the process group is initialized); ``emit`` each record."""
    import hetero_conformance.suite as suite

    ops, reference = _load(name)
    comm = ops.backend.communicator()
    ctx = RankContext(ops, reference, comm, rank, world, seed, scratch)
    cases = [c for c in dist_cases(world, quick=quick) if not patterns or any(suite._matches(c.id, p) for p in patterns)]
    for case in cases:
        emit({"event": "start", "id": case.id})
        t0 = time.perf_counter()
        fatal = False
        try:
            problems, outputs = case.fn(ctx, case)
            status, message = ("fail" if problems else "pass"), "; ".join(problems)
        except Skip as e:
            status, message, outputs = "skipped", str(e), {}
        except Exception as e:
            from hetero.errors import CommError

            fatal = isinstance(e, CommError)
            status, message, outputs = "error", traceback.format_exception_only(type(e), e)[-1].strip(), {}
        emit({"event": "done", "id": case.id, "status": status, "message": message, "outputs": outputs,
              "seconds": time.perf_counter() - t0, "seed": case.seed(seed)})
        if fatal:  # the group is unusable after a failed collective
            raise SystemExit(3)


def _rank_main(rank: int, name: str, world: int, seed: int, quick: bool, patterns: Sequence[str], scratch: str,
               timeout: float) -> None:
    import warnings

    import torch.distributed as dist

    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    warnings.filterwarnings("ignore", message=".*is deprecated.*", category=FutureWarning)
    os.environ["HETERO_COMM_TIMEOUT"] = f"{timeout:g}"
    out = open(Path(scratch) / f"rank{rank}.jsonl", "a", buffering=1)

    def emit(rec: dict[str, Any]) -> None:
        out.write(json.dumps(rec) + "\n")
        out.flush()

    try:
        import hetero

        backend = hetero.load(name).backend
        store = dist.FileStore(str(Path(scratch) / "store"), world)
        dist.init_process_group(backend=type(backend).dist_backend, store=store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout))
        run_rank(name, rank, world, seed=seed, quick=quick, patterns=patterns, scratch=Path(scratch), emit=emit)
        emit({"event": "end"})
    except SystemExit:
        raise
    except BaseException as e:
        emit({"event": "abort", "message": traceback.format_exception_only(type(e), e)[-1].strip()})
        raise SystemExit(2)
    finally:
        out.close()
    # skip destroy_process_group: a peer may be gone; the process exits now
    os._exit(0)


# ---------------------------------------------------------------- the parent

def _read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    recs = []
    for line in path.read_text().splitlines():
        try:
            recs.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a crash
            pass
    return recs


def _merge(cases: list[DistCase], per_rank: list[list[dict[str, Any]]], exits: list[int | None], timed_out: bool,
           seed: int) -> list[CaseResult]:
    world = len(per_rank)
    done = [{r["id"]: r for r in recs if r.get("event") == "done"} for recs in per_rank]
    started = [{r["id"] for r in recs if r.get("event") == "start"} for recs in per_rank]
    aborts = [next((r["message"] for r in recs if r.get("event") == "abort"), "") for recs in per_rank]
    results = []
    for case in cases:
        recs = [d.get(case.id) for d in done]
        if all(recs):
            if all(rec["status"] == "skipped" for rec in recs):
                results.append(_result(case, "skipped", recs[0]["message"], case.seed(seed)))
                continue
            bad = [(r, rec) for r, rec in enumerate(recs) if rec["status"] != "pass"]
            outputs = {f"rank{r}.{k}": v for r, rec in enumerate(recs) for k, v in rec["outputs"].items()}
            seconds = max(rec["seconds"] for rec in recs)
            tol = tolerance("fused_moe" if case.family == "moe" else case.op, case.dtype).as_dict() if outputs and any(
                v.get("kind") == "float" for v in outputs.values()) else (EXACT.as_dict() if outputs else {})
            if bad:
                status = "error" if any(rec["status"] == "error" for _, rec in bad) else "fail"
                message = "; ".join(f"rank {r}: {rec['message']}" for r, rec in bad)
            else:
                status, message = "pass", ""
            results.append(_result(case, status, message, case.seed(seed), seconds=seconds, outputs=outputs, tolerance=tol))
            continue
        missing = [r for r in range(world) if not recs[r]]
        why = []
        for r in missing:
            where = "in this case" if case.id in started[r] else "before this case"
            if aborts[r]:
                why.append(f"rank {r} aborted {where}: {aborts[r]}")
            elif exits[r] is None:
                why.append(f"rank {r} did not finish {where} (killed after the timeout)")
            elif exits[r] != 0:
                code = _signal_name(-exits[r]) if exits[r] < 0 else f"exit code {exits[r]}"
                why.append(f"rank {r} died ({code}) {where}")
            else:
                why.append(f"rank {r} exited {where}")
        status = "timeout" if timed_out and any(exits[r] is None for r in missing) and not any(aborts[r] for r in missing) else "crashed"
        results.append(_result(case, status, "; ".join(why), case.seed(seed)))
    return results


def run_distributed(name: str, world: int, *, seed: int = 0, quick: bool = False, patterns: Sequence[str] = (),
                    timeout: float = 300.0, on_result: Callable[[CaseResult], None] | None = None) -> list[CaseResult]:
    """Spawn ``world`` ranks, run every distributed case on them, merge the ranks' verdicts.

    ``timeout``: seconds the ranks may go without finishing a case before all are killed.
    """
    import multiprocessing

    import hetero_conformance.suite as suite

    cases = [c for c in dist_cases(world, quick=quick) if not patterns or any(suite._matches(c.id, p) for p in patterns)]
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="hetero-conformance-world") as scratch:
        procs = [ctx.Process(target=_rank_main, args=(r, name, world, seed, quick, tuple(patterns), scratch, timeout), daemon=True)
                 for r in range(world)]
        for p in procs:
            p.start()
        files = [Path(scratch) / f"rank{r}.jsonl" for r in range(world)]
        last, progress, timed_out = time.monotonic(), -1, False
        # spawning and importing torch counts against the first case's time, plus a grace period
        grace = 60.0
        while any(p.is_alive() for p in procs):
            size = sum(f.stat().st_size for f in files if f.exists())
            if size != progress:
                progress, last = size, time.monotonic()
            elif time.monotonic() - last > timeout + (grace if progress <= 0 else 0.0):
                timed_out = True
                break
            if any(p.exitcode not in (None, 0) for p in procs):  # one died: give the others a moment, then stop
                deadline = time.monotonic() + min(5.0, timeout)
                while time.monotonic() < deadline and any(p.is_alive() for p in procs):
                    time.sleep(_POLL_S)
                break
            time.sleep(_POLL_S)
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(5)
        exits: list[int | None] = [None if (timed_out and p.exitcode is not None and p.exitcode < 0 and not _ended(files[i]))
                                   else p.exitcode for i, p in enumerate(procs)]
        results = _merge(cases, [_read(f) for f in files], exits, timed_out, seed)
    if on_result is not None:
        for r in results:
            on_result(r)
    return results


def _signal_name(num: int) -> str:
    import signal

    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _ended(path: Path) -> bool:
    return any(r.get("event") in ("end", "abort") for r in _read(path))


# ---------------------------------------------------------------- torchrun

def main(argv: Sequence[str] | None = None) -> int:
    """``torchrun --nproc-per-node N -m hetero_conformance.distributed NAME [--quick] [--seed S]``."""
    import argparse

    import torch.distributed as dist

    p = argparse.ArgumentParser(prog="python -m hetero_conformance.distributed")
    p.add_argument("name")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-k", dest="patterns", action="append", default=[])
    args = p.parse_args(argv)
    import warnings

    warnings.filterwarnings("ignore", message=".*is deprecated.*", category=FutureWarning)
    import hetero
    from hetero.distributed import init

    backend = hetero.load(args.name).backend
    comm = init(type(backend), timeout=None)
    rank, world = comm.rank, comm.world_size
    records: list[dict[str, Any]] = []
    shared = [tempfile.mkdtemp(prefix="hetero-conformance-torchrun-") if rank == 0 else None]
    dist.broadcast_object_list(shared, 0)  # the ranks of torchrun --nproc-per-node share a host
    scratch = Path(shared[0])
    run_rank(args.name, rank, world, seed=args.seed, quick=args.quick, patterns=args.patterns, scratch=scratch, emit=records.append)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, records)
    code = 0
    if rank == 0:
        results = _merge(dist_cases(world, quick=args.quick) if not args.patterns else
                         [c for c in dist_cases(world, quick=args.quick) if any(__import__("hetero_conformance.suite").suite._matches(c.id, p) for p in args.patterns)],
                         gathered, [0] * world, False, args.seed)
        for r in results:
            print(f"{r.status:8} {r.id}  {r.message}")
        code = 0 if all(r.status == "pass" for r in results) else 1
    flag = torch.tensor([code])
    dist.broadcast(flag, 0)
    dist.destroy_process_group()
    if rank == 0:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
    return int(flag.item())


if __name__ == "__main__":
    sys.exit(main())


def run_world_suite(registry: Any, name: str, world: int, selection: Any, *, seed: int = 0, timeout: float = 300.0,
                    console: Any = None, argv: Sequence[str] | None = None) -> Any:
    """A SuiteResult of the distributed cases on ``world`` ranks (``--world-size``), reported like any run."""
    from hetero_conformance.suite import SelectionError, SuiteResult, build_meta

    if selection.ops or selection.dtypes:
        bad = [o for o in selection.ops if o not in {c.op for c in dist_cases(world)} | {"ep_dispatch", "ep_combine"}]
        if bad or any(d != "float32" for d in selection.dtypes):
            raise SelectionError("--world-size runs the collectives and ep_dispatch+ep_combine in float32; "
                                 "select them with -k (e.g. -k all_reduce)")
    ops = registry.load(name)  # BackendNotFound/Unavailable here, not in N ranks
    suite = SuiteResult(build_meta(registry, name, ops.device, seed=seed, selection=selection, isolate=False,
                                   timeout=timeout, argv=argv, world_size=world))
    start = time.perf_counter()
    patterns = tuple(selection.patterns) + tuple(f"{op}/" for op in selection.ops)
    if console is not None:
        console.print(f"spawning {world} ranks of {name}", style="dim", highlight=False)
    suite.results = run_distributed(name, world, seed=seed, quick=selection.quick, patterns=patterns, timeout=timeout)
    suite.meta["run"]["duration_s"] = round(time.perf_counter() - start, 3)
    return suite
