"""The measuring half of ``hetero bench NAME`` (``hetero.bench.cli``): open a session (cases, backend,
environment key, ceilings, baseline), time the cases over one or more rounds, and confirm regressions
against the baseline by re-measuring them.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any, Sequence

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from hetero.bench._fresh import FreshProcessError, time_in_fresh_process
from hetero.bench._timer import TimerConfig
from hetero.bench.baseline import (
    BaselineError,
    Comparison,
    Metric,
    check_environment,
    compare,
    confirm,
    environment,
    load_baseline,
)
from hetero.bench.devices import Ceilings, CeilingsError, device_label, find_ceilings, load_ceilings, override_from_env
from hetero.bench.ops import BenchConfig, OpBench, OpResult
from hetero.errors import UsageError
from hetero.registry import Registry
from hetero.spec import OP_NAMES

__all__ = ["ROUND_SPACING_S", "Session", "confirm_regressions", "open_session", "run_rounds"]


@dataclass
class Session:
    """What one run works with: the bench, its cases, the environment key, the ceilings and the baseline."""

    bench: OpBench
    cases: list[Any]
    skipped: list[OpResult]
    env: dict
    label: str
    ceilings: Ceilings | None
    ceilings_note: str
    saved: dict[str, Metric] | None
    fresh: bool  # re-measure in fresh processes (the backend is an installed plugin)


def _cases(tier: str, only: Sequence[str] | None) -> tuple[list[Any], list[OpResult]]:
    from hetero.bench.perf import UNBENCHED, perf_cases

    unknown = [op for op in only or () if op not in OP_NAMES]
    if unknown:
        raise UsageError(f"argument --ops: unknown op(s) {', '.join(unknown)}; expected some of {', '.join(OP_NAMES)}")
    wanted = list(only) if only else list(OP_NAMES)
    cases = [c for c in perf_cases(tier) if c.op in wanted]
    skipped = [OpBench.skipped(op, UNBENCHED[op]) for op in wanted if op in UNBENCHED]
    return cases, skipped


def _ceilings(args: argparse.Namespace, device_name: str) -> tuple[Ceilings | None, str]:
    path = args.ceilings or override_from_env()
    try:
        override = load_ceilings(path) if path else None
    except CeilingsError as e:
        raise UsageError(f"argument --ceilings: {e}") from e
    return find_ceilings(device_name, override)


def _packages(registry: Registry, name: str) -> dict[str, str]:
    entry = registry.entry(name)
    record = registry.plugins.get(entry.plugin)
    packages = {record.dist if record is not None else name: entry.version}
    from importlib import metadata

    try:
        packages["hetero-conformance"] = metadata.version("hetero-conformance")
    except metadata.PackageNotFoundError:
        pass
    return packages


def open_session(args: argparse.Namespace, registry: Registry, console: Console) -> Session:
    saved_env, saved = None, None
    if args.compare:
        try:
            saved_env, saved = load_baseline(args.compare, "ops")
        except BaselineError as e:
            raise UsageError(f"argument --compare: {e}") from e
    if args.plot:
        from hetero.bench._plot import PlotUnavailable, require_matplotlib

        try:
            require_matplotlib()
        except PlotUnavailable as e:
            raise UsageError(f"argument --plot: {e}") from e
    cases, skipped = _cases(args.shapes, args.ops)
    ops = registry.load(args.name)  # BackendNotFound / BackendUnavailable: a one-line error from the hetero command
    label = device_label(ops.device, registry.availability(args.name).device_name)
    ceilings, note = _ceilings(args, label)
    env = environment(args.name, label, _packages(registry, args.name))
    if saved_env is not None:
        error, warnings = check_environment(saved_env, env)
        if error:
            raise UsageError(f"argument --compare: cannot compare with {args.compare}: {error}")
        for w in warnings:
            console.print(f"[yellow]warning:[/] versions differ from the baseline: {escape(w)}", highlight=False)
    timer = TimerConfig(warmup=args.warmup, reps=args.reps, min_time=args.min_time)
    bench = OpBench(ops, BenchConfig(timer, reference=not args.no_reference, seed=args.seed), ceilings, note)
    fresh = getattr(args, "installed_plugins", False)
    return Session(bench, cases, skipped, env, label, ceilings, note, saved, fresh)


ROUND_SPACING_S = 2.0  # rounds start at least this far apart, so a short burst of load cannot cover them all


def _faster(a: OpResult, b: OpResult) -> OpResult:
    """The result of the pass whose fastest call was faster; an error in any pass is kept."""
    if a.timing is None or b.timing is None:
        return a if a.timing is None else b
    return b if b.timing.min < a.timing.min else a


def run_rounds(session: Session, rounds: int) -> list[OpResult]:
    best: list[OpResult] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("bench", total=len(session.cases) * rounds)
        for r in range(rounds):
            started = time.monotonic()
            for i, case in enumerate(session.cases):
                progress.update(task, description=case.id if rounds == 1 else f"{case.id} (round {r + 1}/{rounds})")
                result = session.bench.run(case)
                if r == 0:
                    best.append(result)
                else:
                    best[i] = _faster(best[i], result)
                progress.advance(task)
            if r + 1 < rounds:
                time.sleep(max(0.0, ROUND_SPACING_S - (time.monotonic() - started)))
    return best + session.skipped


def _retime(session: Session, args: argparse.Namespace, names: list[str], console: Console) -> dict[str, float]:
    """The fastest call of each named case, in a fresh process when the backend is an installed plugin."""
    if session.fresh:
        try:
            return time_in_fresh_process(
                args.name, args.shapes, names, session.bench.config.timer, args.seed, args.threads
            )
        except FreshProcessError as e:
            session.fresh = False
            console.print(
                f"re-measuring in this process: a fresh one failed ({escape(str(e))})", style="dim", highlight=False
            )
    by_id = {c.id: c for c in session.cases}
    return {n: session.bench.time_case(by_id[n]).min for n in names}


def confirm_regressions(
    session: Session, results: list[OpResult], args: argparse.Namespace, console: Console
) -> list[Comparison]:
    """Compare with the baseline; re-measure the regressions up to ``--repeats`` times, keeping each op's best.

    The repeats come in rounds after pauses of 1, 2, 4... seconds, each round
    re-timing the ops still regressed, in a fresh process (see ``_fresh``): load
    from another tenant of a shared machine can last tens of seconds, and a
    process's memory layout lasts as long as the process."""
    assert session.saved is not None
    metrics = [r.metric() for r in results if r.timing is not None]
    first = {c.name: c for c in compare(session.saved, metrics, args.threshold)}
    comparisons = dict(first)
    pools: dict[str, list[float]] = {}
    for i in range(args.repeats):
        flagged = [c for c in comparisons.values() if c.regressed]
        if not flagged:
            break
        where = "a fresh process" if session.fresh else "this process"
        names = ", ".join(f"{c.name} ({c.change:+.0%})" for c in flagged)
        console.print(
            f"re-measuring in {where} after {2**i} s ({i + 1}/{args.repeats}): {names}", style="dim", highlight=False
        )
        time.sleep(2**i)
        for name, seconds in _retime(session, args, [c.name for c in flagged], console).items():
            pools.setdefault(name, []).append(seconds)
            comparisons[name] = confirm(first[name], pools[name], args.threshold)
    return list(comparisons.values())
