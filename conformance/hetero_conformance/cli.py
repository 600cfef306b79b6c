"""``hetero conformance NAME``: run the case catalog against a backend and write the reports.

hetero's own CLI adds the subcommand with :func:`add_parser` through the entry point group
``hetero.commands`` (``hetero_conformance.commands``), when this package is installed.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any, Sequence

from hetero.cli_args import add_list_option

__all__ = ["add_parser", "command", "EXIT_OK", "EXIT_FAIL", "EXIT_USAGE"]

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


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
        description=(
            "Run the conformance catalog (every op on real-model shapes and edge cases, per dtype) against a backend."
        ),
    )
    p.add_argument("name", help="backend name, e.g. cpu_ref (cuda:1 picks a device index)")
    p.add_argument("--quick", action="store_true", help="the CI tier (about a minute); default: the full catalog")
    add_list_option(
        p, "--ops", metavar="A,B", help="only these ops (a,b or a b; repeatable); also filters --robustness"
    )
    add_list_option(
        p, "--dtypes", metavar="D,E", help="only these case dtypes (float32, bfloat16, ...; a,b or a b; repeatable)"
    )
    p.add_argument(
        "-k",
        dest="patterns",
        action="append",
        default=[],
        metavar="PATTERN",
        help=(
            "only case ids (op/shape/dtype) matching PATTERN: a glob if it has *?[, else a substring; "
            "repeatable (any matches)"
        ),
    )
    p.add_argument("--seed", type=int, default=0, help="base seed of the random inputs (default 0)")
    p.add_argument("--json", metavar="FILE", help="write the JSON report (schema: docs/conformance-report.md)")
    p.add_argument("--junit", metavar="FILE", help="write a JUnit XML report")
    p.add_argument("--markdown", metavar="FILE", help="write a Markdown summary (for a PR comment)")
    p.add_argument(
        "--isolate",
        action="store_true",
        help="run each op family in a worker process: a crash or hang is reported, the run goes on",
    )
    p.add_argument(
        "--timeout",
        type=_positive,
        default=None,
        metavar="S",
        help="with --isolate: seconds one case may run before its worker is killed (default 300); "
        "with --robustness: one malformed call (default 60)",
    )
    p.add_argument(
        "--robustness",
        action="store_true",
        help="the robustness tier instead of the numeric catalog: malformed calls of every op, each in its own forked "
        "worker, must raise hetero.OpError naming the op (statuses rejected/silent/unclear/crashed/timeout)",
    )
    p.add_argument(
        "--no-validate",
        dest="validate",
        action="store_false",
        help="with --robustness: load the backend with validate=False (silent passes for index-content defects; "
        "a crash or hang still fails)",
    )
    p.add_argument(
        "--world-size",
        type=int,
        default=1,
        metavar="N",
        help="spawn N ranks and check the collectives and ep_dispatch/ep_combine against the single-process "
        "reference (default 1: the op catalog in this process); --timeout: seconds a rank may spend on one case",
    )
    p.add_argument("--list", action="store_true", help="print the selected case ids and exit")
    p.add_argument(
        "--catalog",
        default=None,
        metavar="MODULE:FUNC",
        help="another case catalog (a function taking quick=; with --robustness, one taking nothing that returns "
        "Malformed calls); default: the built-in one",
    )
    p.set_defaults(func=command)
    return p


def _selection(args: argparse.Namespace) -> Any:
    from hetero_conformance.suite import DEFAULT_CATALOG, Selection

    return Selection(
        quick=args.quick,
        ops=tuple(args.ops or ()),
        dtypes=tuple(args.dtypes or ()),
        patterns=tuple(args.patterns),
        catalog=args.catalog or DEFAULT_CATALOG,
        robustness=getattr(args, "robustness", False),
    )


def _timeout(args: argparse.Namespace) -> float:
    """--timeout, else its default for the run's kind (seconds per case, or per malformed call)."""
    from hetero_conformance.robustness import DEFAULT_TIMEOUT_S

    if args.timeout is not None:
        return args.timeout
    return DEFAULT_TIMEOUT_S if getattr(args, "robustness", False) else 300.0


def _robustness_conflict(args: argparse.Namespace) -> str | None:
    """Why the options cannot go together, or None."""
    if not getattr(args, "robustness", False):
        return None if getattr(args, "validate", True) else "--no-validate applies to --robustness only"
    given = [
        flag
        for flag, on in (
            ("--quick", args.quick),
            ("--dtypes", bool(args.dtypes)),
            ("--isolate", args.isolate),
            ("--world-size", getattr(args, "world_size", 1) > 1),
        )
        if on
    ]
    if given:
        return f"--robustness is a tier of its own (every call already runs in its own worker): drop {', '.join(given)}"
    return None


def _canonical(args: argparse.Namespace, selection: Any) -> list[str]:
    """The command line that reproduces this run (without the report paths)."""
    argv = [args.name] + (["--quick"] if selection.quick else []) + (["--robustness"] if selection.robustness else [])
    argv += ["--no-validate"] if not getattr(args, "validate", True) else []
    argv += ["--ops", ",".join(selection.ops)] if selection.ops else []
    argv += ["--dtypes", ",".join(selection.dtypes)] if selection.dtypes else []
    for pattern in selection.patterns:
        argv += ["-k", pattern]
    argv += ["--seed", str(args.seed)]
    world = getattr(args, "world_size", 1)
    argv += ["--isolate"] if args.isolate else []
    argv += ["--world-size", str(world)] if world > 1 else []
    argv += ["--timeout", f"{_timeout(args):g}"] if args.isolate or world > 1 or selection.robustness else []
    return argv + (["--catalog", args.catalog] if args.catalog else [])


def _list(console: Any, cases: Sequence[Any], what: str = "cases") -> int:
    for case in cases:
        mark = "  (quick)" if getattr(case, "quick", False) else "  (index)" if getattr(case, "index", False) else ""
        console.print(case.id + mark, highlight=False, markup=False)
    console.print(f"{len(cases)} {what}", style="dim")
    return EXIT_OK


def _write_reports(args: argparse.Namespace, suite: Any, console: Any) -> None:
    from hetero_conformance import report

    for path, write in (
        (args.json, report.write_json),
        (args.junit, report.write_junit),
        (args.markdown, report.write_markdown),
    ):
        if path:
            write(suite, path)
            console.print(f"wrote {path}", style="dim", highlight=False)


def _run(args: argparse.Namespace, registry: Any, console: Any, selection: Any) -> Any:
    """The run the options ask for (--robustness, --world-size N, or the catalog in this process or isolated)."""
    from hetero_conformance.suite import SelectionError, run_suite

    world, argv, timeout = getattr(args, "world_size", 1), _canonical(args, selection), _timeout(args)
    if world < 1:
        raise SelectionError(f"--world-size must be >= 1, got {world}")
    if selection.robustness:
        from hetero_conformance.robustness import run_robustness_suite

        return run_robustness_suite(
            registry,
            args.name,
            selection,
            validate=args.validate,
            seed=args.seed,
            timeout=timeout,
            console=console,
            argv=argv,
        )
    if world > 1:
        from hetero_conformance.distributed import run_world_suite

        return run_world_suite(
            registry, args.name, world, selection, seed=args.seed, timeout=timeout, console=console, argv=argv
        )
    return run_suite(
        registry,
        args.name,
        selection,
        seed=args.seed,
        isolate=args.isolate,
        timeout=timeout,
        console=console,
        argv=argv,
    )


def _listing(args: argparse.Namespace, console: Any, selection: Any) -> int:
    """--list: the case ids (or malformed-call ids) the run would check."""
    from hetero_conformance.suite import selected_cases

    if selection.robustness:
        from hetero_conformance.robustness import selected_calls

        return _list(console, selected_calls(selection), "malformed calls")
    if getattr(args, "world_size", 1) > 1:
        from hetero_conformance.distributed import dist_cases

        return _list(console, dist_cases(args.world_size, quick=args.quick))
    return _list(console, selected_cases(selection))


def command(args: argparse.Namespace, registry: Any, console: Any) -> int:
    """Run the subcommand: 0 when every case passed or was skipped, 1 on any failure, 2 on a usage error."""
    from rich.console import Console
    from rich.markup import escape

    from hetero.errors import BackendIncompatible, BackendUnavailable
    from hetero_conformance import report
    from hetero_conformance.suite import SelectionError

    err = Console(stderr=True)
    selection = _selection(args)
    try:
        conflict = _robustness_conflict(args)
        if conflict:
            raise SelectionError(conflict)
        if args.list:
            return _listing(args, console, selection)
        suite = _run(args, registry, console, selection)
    except (SelectionError, BackendUnavailable, BackendIncompatible) as e:
        err.print(f"[red]hetero conformance:[/] {escape(str(e))}", highlight=False)
        return EXIT_USAGE
    if not suite.results and not (suite.robustness is not None and suite.robustness.calls):
        err.print(
            f"[red]hetero conformance:[/] no case matches {escape(shlex.join(_canonical(args, selection)))}",
            highlight=False,
        )
        return EXIT_USAGE
    report.print_summary(console, suite)
    _write_reports(args, suite, console)
    return EXIT_OK if suite.ok else EXIT_FAIL
