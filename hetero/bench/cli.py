"""``hetero bench NAME``: time every op of a backend on performance shapes, save and compare baselines.

Exit codes: 0 when every op ran and none regressed; 1 when an op regressed
beyond the threshold (after its re-measurements) or raised; 2 for a usage
error (unknown op, unusable baseline or ceilings file, a baseline of another
backend or device, an unavailable backend, --plot without matplotlib).

This module parses the arguments and reports; the measuring (session, rounds,
re-measurement of regressions) is in ``hetero.bench._session``.
"""

from __future__ import annotations

import argparse
import math
import shlex
from typing import Any

from rich.console import Console

from hetero.bench._session import Session, confirm_regressions, open_session, run_rounds
from hetero.bench._timer import torch_threads
from hetero.bench.baseline import Comparison, save_baseline
from hetero.bench.ops import ERROR, OpResult
from hetero.bench.report import print_report, report_dict
from hetero.cli_args import add_list_option
from hetero.errors import UsageError
from hetero.registry import Registry

__all__ = ["add_parser"]

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


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


def _write_outputs(
    args: argparse.Namespace,
    session: Session,
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
    session = open_session(args, registry, console)
    results = run_rounds(session, args.rounds or (2 if args.save else 1))
    comparisons = confirm_regressions(session, results, args, console) if session.saved is not None else None
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
