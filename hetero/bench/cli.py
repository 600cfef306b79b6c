"""``hetero bench NAME``: time every op of a backend on performance shapes, save and compare baselines.

Exit codes: 0 when every op ran and none regressed; 1 when an op regressed
beyond the threshold (after its re-measurements) or raised; 2 for a usage
error (unknown op, unusable baseline or ceilings file, a baseline of another
backend or device, an unavailable backend, --plot without matplotlib).
"""

from __future__ import annotations

import argparse
import math
import shlex
import time
from dataclasses import dataclass
from typing import Any, Sequence

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from hetero.bench._fresh import FreshProcessError, time_in_fresh_process
from hetero.bench._timer import TimerConfig, torch_threads
from hetero.bench.baseline import (
    BaselineError,
    Comparison,
    Metric,
    check_environment,
    compare,
    confirm,
    environment,
    load_baseline,
    save_baseline,
)
from hetero.bench.devices import Ceilings, CeilingsError, device_label, find_ceilings, load_ceilings, override_from_env
from hetero.bench.ops import ERROR, BenchConfig, OpBench, OpResult
from hetero.bench.report import print_report, report_dict
from hetero.cli_args import add_list_option
from hetero.errors import UsageError
from hetero.registry import Registry
from hetero.spec import OP_NAMES

__all__ = ["add_parser"]

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


@dataclass
class _Session:
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


def add_parser(sub: Any) -> None:
    """Register the ``bench`` subcommand on the ``hetero`` command's subparsers."""
    p = sub.add_parser(
        "bench",
        help="time every op of a backend on performance shapes; save and compare baselines",
        description="Times each op on performance shapes (median of many calls after warm-up) and reports "
        "time, GB/s and TFLOP/s from each op's byte/flop model, the speed-up over the reference "
        "(cpu_ref, same device, same run) and the fraction of the device's roofline.",
    )
    p.add_argument("name", help="backend name, e.g. cuda or cpu_ref")
    add_list_option(p, "--ops", metavar="OP", help="only these ops, as a,b or a b or repeated (default: all)")
    p.add_argument(
        "--shapes",
        choices=("quick", "full"),
        default="quick",
        help="quick: CPU-sized float32 cases (CI); full: production GPU sizes in bfloat16",
    )
    p.add_argument("--json", metavar="F", help="write the results as JSON to F")
    p.add_argument("--save", metavar="BASELINE", help="write a baseline JSON (keyed by backend, device, versions)")
    p.add_argument(
        "--compare",
        metavar="BASELINE",
        help="compare with a baseline; exit 1 if an op is slower by more than --threshold",
    )
    p.add_argument(
        "--threshold", type=float, default=0.1, help="relative slow-down that counts as a regression (default 0.1)"
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=4,
        help="re-measurements of an op flagged as regressed, after pauses of 1, 2, 4... s (default 4)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        metavar="N",
        help="passes over the ops, each op keeping its fastest pass (default: 2 with --save, else 1): "
        "a baseline taken during a burst of load would hide later regressions",
    )
    p.add_argument(
        "--plot", metavar="F.png", help="plot time per op (and baseline, roofline) to F.png (needs hetero[plot])"
    )
    p.add_argument(
        "--ceilings",
        metavar="FILE.json",
        help="measured device ceilings (default: $HETERO_BENCH_CEILINGS, else datasheets)",
    )
    p.add_argument("--no-reference", action="store_true", help="do not time the reference for the 'x ref' column")
    p.add_argument("--warmup", type=int, default=5, help="warm-up calls per op on the CPU (default 5)")
    p.add_argument("--reps", type=int, default=20, help="least timed calls per op on the CPU (default 20)")
    p.add_argument("--min-time", type=float, default=0.2, help="least seconds of timed calls per op (default 0.2)")
    p.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        metavar="N",
        help="torch CPU threads for this run, part of a CPU's baseline key (default 1: on a shared machine "
        "multi-threaded CPU timings move by tens of percent from run to run)",
    )
    p.set_defaults(func=_cmd_bench)


def _command(args: argparse.Namespace) -> str:
    parts = ["hetero", "bench", args.name, "--shapes", args.shapes]
    parts += ["--ops", *args.ops] if args.ops else []
    parts += ["--threads", str(args.threads)] if args.threads else []
    parts += ["--warmup", str(args.warmup), "--reps", str(args.reps), "--min-time", str(args.min_time)]
    parts += ["--rounds", str(args.rounds)] if args.rounds else []
    return shlex.join(parts)


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


def _session(args: argparse.Namespace, registry: Registry, console: Console) -> _Session:
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
    return _Session(bench, cases, skipped, env, label, ceilings, note, saved, fresh)


ROUND_SPACING_S = 2.0  # rounds start at least this far apart, so a short burst of load cannot cover them all


def _faster(a: OpResult, b: OpResult) -> OpResult:
    """The result of the pass whose fastest call was faster; an error in any pass is kept."""
    if a.timing is None or b.timing is None:
        return a if a.timing is None else b
    return b if b.timing.min < a.timing.min else a


def _run(session: _Session, rounds: int) -> list[OpResult]:
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


def _retime(session: _Session, args: argparse.Namespace, names: list[str], console: Console) -> dict[str, float]:
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


def _confirmed(
    session: _Session, results: list[OpResult], args: argparse.Namespace, console: Console
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


def _write_outputs(
    args: argparse.Namespace,
    session: _Session,
    results: list[OpResult],
    comparisons: list[Comparison] | None,
    header: str,
) -> None:
    import json
    from pathlib import Path

    if args.json:
        doc = report_dict(results, session.env, session.ceilings, session.ceilings_note, comparisons, args.threshold)
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    if args.save:
        metrics = [r.metric() for r in results if r.timing is not None]
        save_baseline(args.save, "ops", session.env, metrics, _command(args))
    if args.plot:
        from hetero.bench._plot import plot

        plot(args.plot, results, {c.name: c for c in comparisons} if comparisons else None, header)


def _verdict(console: Console, results: list[OpResult], comparisons: list[Comparison] | None) -> int:
    errors = [r.case_id for r in results if r.status == ERROR]
    regressed = [c for c in comparisons or () if c.regressed]
    missing = [c.name for c in comparisons or () if c.note and math.isnan(c.current)]
    if missing:
        console.print(
            f"{len(missing)} baseline metric(s) not measured in this run (other --ops or --shapes?)",
            style="dim",
            highlight=False,
        )
    for c in regressed:
        spread = "" if c.spread is None else f", spread {c.spread[0]:.3g}/{c.spread[1]:.3g}/{c.spread[2]:.3g} s"
        console.print(
            f"[bold red]regressed:[/] {c.name}: {c.baseline:.3g} s -> {c.current:.3g} s ({c.change:+.0%}{spread})",
            highlight=False,
        )
    for case_id in errors:
        console.print(f"[red]error:[/] {case_id} raised (see the table notes)", highlight=False)
    return EXIT_FAIL if regressed or errors else EXIT_OK


def _cmd_bench(args: argparse.Namespace, registry: Registry, console: Console) -> int:
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"argument --threads: expected an integer >= 1, got {args.threads}")
    with torch_threads(args.threads):
        return _bench(args, registry, console)


def _check_numbers(args: argparse.Namespace) -> None:
    least = (
        ("--threshold", args.threshold, 0),
        ("--repeats", args.repeats, 0),
        ("--warmup", args.warmup, 0),
        ("--min-time", args.min_time, 0),
        ("--reps", args.reps, 1),
        ("--rounds", args.rounds, 1),
    )
    for option, value, minimum in least:
        if value is not None and value < minimum:
            raise UsageError(f"{option} must be >= {minimum}, got {value}")


def _bench(args: argparse.Namespace, registry: Registry, console: Console) -> int:
    _check_numbers(args)
    session = _session(args, registry, console)
    results = _run(session, args.rounds or (2 if args.save else 1))
    comparisons = _confirmed(session, results, args, console) if session.saved is not None else None
    roof = session.ceilings.name if session.ceilings is not None else "unknown ceilings"
    header = f"hetero bench {args.name} on {session.label} ({args.shapes} shapes; roofline: {roof})"
    print_report(
        console,
        results,
        header=header,
        threshold=args.threshold,
        comparisons={c.name: c for c in comparisons} if comparisons is not None else None,
    )
    _write_outputs(args, session, results, comparisons, header)
    return _verdict(console, results, comparisons)
