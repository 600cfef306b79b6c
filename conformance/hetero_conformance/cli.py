"""``hetero conformance NAME``: run the case catalog against a backend and write the reports.

hetero's own CLI imports this module only when the package is installed and
adds the subcommand with :func:`add_parser`.
"""
from __future__ import annotations

import argparse
import shlex
from typing import Any, Sequence

__all__ = ["add_parser", "command", "EXIT_OK", "EXIT_FAIL", "EXIT_USAGE"]

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``conformance`` subcommand to ``subparsers``; its function is :func:`command`."""
    p = subparsers.add_parser(
        "conformance",
        help="check a backend's ops against the float64 reference (exit 1 on any failure)",
        description="Run the conformance catalog (every op on real-model shapes and edge cases, per dtype) against a backend.",
    )
    p.add_argument("name", help="backend name, e.g. cpu_ref (cuda:1 picks a device index)")
    p.add_argument("--quick", action="store_true", help="the CI tier (about a minute); default: the full catalog")
    p.add_argument("--ops", type=_csv, action="append", default=[], metavar="A,B", help="only these ops")
    p.add_argument("--dtypes", type=_csv, action="append", default=[], metavar="D,E", help="only these case dtypes (float32, bfloat16, ...)")
    p.add_argument("-k", dest="patterns", action="append", default=[], metavar="PATTERN",
                   help="only case ids (op/shape/dtype) matching PATTERN: a glob if it has *?[, else a substring; repeatable (any matches)")
    p.add_argument("--seed", type=int, default=0, help="base seed of the random inputs (default 0)")
    p.add_argument("--json", metavar="FILE", help="write the JSON report (schema: docs/conformance-report.md)")
    p.add_argument("--junit", metavar="FILE", help="write a JUnit XML report")
    p.add_argument("--markdown", metavar="FILE", help="write a Markdown summary (for a PR comment)")
    p.add_argument("--isolate", action="store_true", help="run each op family in a worker process: a crash or hang is reported, the run goes on")
    p.add_argument("--timeout", type=_positive, default=300.0, metavar="S",
                   help="with --isolate: seconds one case may run before its worker is killed (default 300)")
    p.add_argument("--world-size", type=int, default=1, metavar="N",
                   help="spawn N ranks and check the collectives and ep_dispatch/ep_combine against the single-process "
                        "reference (default 1: the op catalog in this process); --timeout: seconds a rank may spend on one case")
    p.add_argument("--list", action="store_true", help="print the selected case ids and exit")
    p.add_argument("--catalog", default=None, metavar="MODULE:FUNC", help="another case catalog (a function taking quick=); default: the built-in one")
    p.set_defaults(func=command)
    return p


def _selection(args: argparse.Namespace) -> Any:
    from hetero_conformance.suite import DEFAULT_CATALOG, Selection

    flat = lambda groups: tuple(x for g in groups for x in g)  # noqa: E731
    return Selection(quick=args.quick, ops=flat(args.ops), dtypes=flat(args.dtypes), patterns=tuple(args.patterns), catalog=args.catalog or DEFAULT_CATALOG)


def _canonical(args: argparse.Namespace, selection: Any) -> list[str]:
    """The command line that reproduces this run (without the report paths)."""
    argv = [args.name] + (["--quick"] if selection.quick else [])
    argv += ["--ops", ",".join(selection.ops)] if selection.ops else []
    argv += ["--dtypes", ",".join(selection.dtypes)] if selection.dtypes else []
    for pattern in selection.patterns:
        argv += ["-k", pattern]
    argv += ["--seed", str(args.seed)]
    argv += ["--isolate", "--timeout", f"{args.timeout:g}"] if args.isolate else []
    world = getattr(args, "world_size", 1)
    argv += ["--world-size", str(world)] if world > 1 else []
    argv += ["--timeout", f"{args.timeout:g}"] if world > 1 and not args.isolate else []
    return argv + (["--catalog", args.catalog] if args.catalog else [])


def _list(console: Any, cases: Sequence[Any]) -> int:
    for case in cases:
        console.print(case.id + ("  (quick)" if case.quick else ""), highlight=False, markup=False)
    console.print(f"{len(cases)} cases", style="dim")
    return EXIT_OK


def _write_reports(args: argparse.Namespace, suite: Any, console: Any) -> None:
    from hetero_conformance import report

    for path, write in ((args.json, report.write_json), (args.junit, report.write_junit), (args.markdown, report.write_markdown)):
        if path:
            write(suite, path)
            console.print(f"wrote {path}", style="dim", highlight=False)


def command(args: argparse.Namespace, registry: Any, console: Any) -> int:
    """Run the subcommand: 0 when every case passed or was skipped, 1 on any failure, 2 on a usage error."""
    from rich.console import Console
    from rich.markup import escape

    from hetero.errors import BackendIncompatible, BackendUnavailable
    from hetero_conformance import report
    from hetero_conformance.suite import SelectionError, run_suite, selected_cases

    err = Console(stderr=True)
    selection = _selection(args)
    try:
        world = getattr(args, "world_size", 1)
        if world < 1:
            raise SelectionError(f"--world-size must be >= 1, got {world}")
        if world > 1 and args.list:
            from hetero_conformance.distributed import dist_cases
            return _list(console, [c for c in dist_cases(world, quick=args.quick)])
        if args.list:
            return _list(console, selected_cases(selection))
        if world > 1:
            from hetero_conformance.distributed import run_world_suite

            suite = run_world_suite(registry, args.name, world, selection, seed=args.seed, timeout=args.timeout,
                                    console=console, argv=_canonical(args, selection))
        else:
            suite = run_suite(registry, args.name, selection, seed=args.seed, isolate=args.isolate, timeout=args.timeout,
                              console=console, argv=_canonical(args, selection))
    except (SelectionError, BackendUnavailable, BackendIncompatible) as e:
        err.print(f"[red]hetero conformance:[/] {escape(str(e))}", highlight=False)
        return EXIT_USAGE
    if not suite.results:
        err.print(f"[red]hetero conformance:[/] no case matches {escape(shlex.join(_canonical(args, selection)))}", highlight=False)
        return EXIT_USAGE
    report.print_summary(console, suite)
    _write_reports(args, suite, console)
    return EXIT_OK if suite.ok else EXIT_FAIL
