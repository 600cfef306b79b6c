"""The ``hetero`` command: backends | explain | conformance | generate | check-model | bench | ceilings |
bench-engine | profile | quantize | serve | new-backend.

An error the user can fix (``hetero.errors.USER_ERRORS``: a bad argument, a missing file, an unknown
or unavailable backend) prints one line, ``hetero <command>: error: ...``, and exits 2; a broken rank group
under torchrun (``CommError``: a peer died) prints one line and exits 1; ``--debug`` or
``HETERO_DEBUG=1`` shows its traceback instead. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import Any, NoReturn, Sequence

from rich.console import Console
from rich.table import Table

from hetero.errors import USER_ERRORS, CommError, UsageError
from hetero.ops import BACKEND
from hetero.registry import Registry, default_registry
from hetero.spec import OP_NAMES, SPEC_VERSION

__all__ = ["main", "backends_report", "explain_report"]

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def backends_report(registry: Registry) -> list[dict[str, Any]]:
    """One row per known backend: package, version, device, status, reason and op counts."""
    rows = []
    for name in registry.names():
        entry = registry.backends[name]
        ops, avail = registry.inspect(name)
        status = entry.status if entry.status != "ok" else ("available" if avail.ok else "unavailable")
        info = ops.explain() if ops is not None else {}
        native = [op for op, i in info.items() if i.origin == BACKEND or i.origin.startswith("override")]
        rows.append(
            {
                "name": name,
                "plugin": entry.plugin,
                "package": registry.plugins[entry.plugin].dist if entry.plugin in registry.plugins else "",
                "version": entry.version,
                "status": status,
                "reason": avail.reason if not avail.ok or avail.reason else "",
                "device": avail.device_name if avail.ok else "",
                "priority": entry.cls.priority if entry.cls is not None else None,
                "native_ops": native,
                "fallback_ops": [op for op in info if op not in native],
                "warnings": list(entry.warnings),
            }
        )
    return rows


def explain_report(registry: Registry, name: str) -> dict[str, Any]:
    """Per op of ``name``: implementation, origin (backend, override:<plugin>, fallback) and reasons."""
    entry = registry.entry(name)
    ops, avail = registry.inspect(name)
    return {
        "backend": name,
        "spec_version": SPEC_VERSION,
        "backend_spec_version": getattr(entry.cls, "spec_version", None),
        "version": entry.version,
        "status": entry.status if entry.status != "ok" else ("available" if avail.ok else "unavailable"),
        "reason": avail.reason,
        "device": avail.device_name,
        "details": {k: str(v) for k, v in dict(avail.details).items()},
        "ops": [i.as_dict() for i in ops.explain().values()] if ops is not None else [],
    }


def _status_style(status: str) -> str:
    return {"available": "green", "unavailable": "yellow"}.get(status, "red")


def _print_backends(console: Console, rows: list[dict[str, Any]]) -> None:
    table = Table(title=f"hetero backends (spec {SPEC_VERSION})")
    for col in ("name", "package", "device", "status", "native/fallback", "reason"):
        table.add_column(col, overflow="fold")
    for r in rows:
        ops = f"{len(r['native_ops'])}/{len(r['fallback_ops'])}" if r["native_ops"] or r["fallback_ops"] else "-"
        style = _status_style(r["status"])
        row = (r["name"], f"{r['package']} {r['version']}", r["device"] or "-", f"[{style}]{r['status']}[/]")
        table.add_row(*row, ops, r["reason"])
    console.print(table)


def _print_explain(console: Console, report: dict[str, Any]) -> None:
    style = _status_style(report["status"])
    head = f"[bold]{report['backend']}[/] {report['version']}: [{style}]{report['status']}[/]"
    console.print(
        head
        + (f" on {report['device']}" if report["device"] else "")
        + (f" ({report['reason']})" if report["reason"] else "")
    )
    table = Table(show_header=True)
    for col in ("op", "origin", "implementation", "reasons"):
        table.add_column(col, overflow="fold")
    for op in report["ops"]:
        origin_style = "green" if op["origin"] == BACKEND or op["origin"].startswith("override") else "yellow"
        table.add_row(op["op"], f"[{origin_style}]{op['origin']}[/]", op["implementation"], "; ".join(op["reasons"]))
    console.print(table)


def _cmd_backends(args: argparse.Namespace, registry: Registry, console: Console) -> int:
    rows = backends_report(registry)
    if args.json:
        print(json.dumps({"spec_version": SPEC_VERSION, "backends": rows}, indent=2))
    else:
        _print_backends(console, rows)
    return EXIT_OK


def _cmd_explain(args: argparse.Namespace, registry: Registry, console: Console) -> int:
    report = explain_report(registry, args.name)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_explain(console, report)
    return EXIT_OK if report["status"] in ("available", "unavailable") else EXIT_FAIL


class _Parser(argparse.ArgumentParser):
    """argparse's errors as the command's other usage errors: one line, exit 2 (``--help`` shows the usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:  # named after the subcommand whose options they were meant for
            command = getattr(namespace, "command", None)
            prog = f"{self.prog} {command}" if command else self.prog
            self.exit(EXIT_USAGE, f"{prog}: error: unrecognized arguments: {' '.join(extras)}\n")
        return namespace


def _add_debug(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument(
        "--debug",
        action="store_true",
        default=default,
        help="show the traceback of a usage error (also HETERO_DEBUG=1)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hetero", description="hardware-neutral LLM inference operators")
    _add_debug(parser, False)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("backends", help="list installed backends, their status and op coverage")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_cmd_backends)
    p = sub.add_parser("explain", help=f"per op of a backend ({len(OP_NAMES)} ops): implementation, origin, reasons")
    p.add_argument("name", help="backend name, e.g. cpu_ref")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_cmd_explain)
    _add_plugin_commands(sub)
    from hetero.tools.cli import add_parsers as add_engine_parsers

    add_engine_parsers(sub)
    from hetero.bench.cli import add_parser as add_bench_parser

    add_bench_parser(sub)
    from hetero.bench.ceilings_cli import add_parser as add_ceilings_parser

    add_ceilings_parser(sub)
    from hetero.tools.profile.cli import add_parser as add_profile_parser

    add_profile_parser(sub)
    from hetero.serve.cli import add_parser as add_serve_parser

    add_serve_parser(sub)
    p = sub.add_parser(
        "new-backend",
        help="write a ready plugin package hetero-NAME/ for a new chip",
        description="Write hetero-NAME/: pyproject.toml with the hetero.backends entry point, the Backend "
        "subclass (every op falls back to the reference until you implement it), a conformance "
        "test for CI and a README on what to implement next.",
    )
    p.add_argument("name", help="backend name: lowercase letters, digits, underscores (e.g. mychip)")
    p.add_argument(
        "--triton",
        action="store_true",
        help="subclass hetero.kernels.TritonBackend: every op native through the portable Triton kernels",
    )
    p.add_argument(
        "--dir", default=".", metavar="D", help="where to create hetero-NAME/ (default: the current directory)"
    )
    p.set_defaults(func=_cmd_new_backend, needs_registry=False)
    for p in sub.choices.values():
        # SUPPRESS: after the subcommand, --debug sets the top-level flag instead of resetting it;
        # a subcommand (from a plugin) that has its own --debug keeps it
        with contextlib.suppress(argparse.ArgumentError):
            _add_debug(p, argparse.SUPPRESS)
    return parser


def _cmd_new_backend(args: argparse.Namespace, registry: Registry | None, console: Console) -> int:
    from hetero._scaffold import ScaffoldError, create

    try:
        root = create(args.name, args.dir, triton=args.triton)
    except ScaffoldError as e:
        raise UsageError(str(e)) from e
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        console.print(f"wrote {path}", style="dim", highlight=False, markup=False)
    if not (root / "tests").exists():
        console.print(
            "no conformance test written: hetero-conformance is not installed (it provides tests/ through the "
            "hetero.commands entry point); pip install hetero-conformance to check the backend",
            style="yellow",
            highlight=False,
            markup=False,
        )
    console.print(
        f"next: pip install -e {root} && hetero explain {args.name} && hetero conformance {args.name} --quick",
        highlight=False,
        markup=False,
    )
    return EXIT_OK


def _cmd_conformance_missing(args: argparse.Namespace, registry: Registry, console: Console) -> int:
    raise UsageError("the conformance suite is not installed: pip install hetero-conformance")


def _add_plugin_commands(sub: Any) -> None:
    """The subcommands of other packages (``hetero.commands``: ``conformance`` from hetero-conformance).

    One that fails to load or to add its parsers is reported on stderr and left out; the others work."""
    from hetero.commands import commands

    for command in commands():
        add = getattr(command.obj, "add_parsers", None)
        try:
            if command.error:
                raise RuntimeError(command.error)
            if add is not None:
                add(sub)
        except Exception as e:
            print(
                f"hetero: warning: commands of {command.dist or command.name} ({command.name}) left out: {e}",
                file=sys.stderr,
            )
    if "conformance" not in sub.choices:
        p = sub.add_parser(
            "conformance", help="check a backend against the reference (needs hetero-conformance)", add_help=False
        )
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(func=_cmd_conformance_missing)


def main(argv: Sequence[str] | None = None, *, registry: Registry | None = None) -> int:
    """Run the ``hetero`` command; returns its exit code (2 for a user error, see the module docstring)."""
    args = build_parser().parse_args(argv)
    try:
        return _run(args, registry)
    except (*USER_ERRORS, CommError) as e:
        if args.debug or os.environ.get("HETERO_DEBUG", "") not in ("", "0"):
            raise
        print(f"hetero {args.command}: error: {_one_line(e, args)}", file=sys.stderr)
        return EXIT_FAIL if isinstance(e, CommError) else EXIT_USAGE


def _run(args: argparse.Namespace, registry: Registry | None) -> int:
    # piped into a CI log, rich would fold tables to 80 columns; COLUMNS still wins when set
    console = Console() if sys.stdout.isatty() or "COLUMNS" in os.environ else Console(width=160)
    if not getattr(args, "needs_registry", True):
        return args.func(args, registry, console)
    args.installed_plugins = registry is None  # a child process can load the same backends by name
    return args.func(args, registry or default_registry(), console)


def _one_line(error: Exception, args: argparse.Namespace) -> str:
    """The error's message on one line.

    A subcommand lists in ``args.api_options`` the API arguments (SamplingParams,
    EngineConfig fields) it passes on unchanged from its options of the same name: a
    UsageError about one of them names the option the user typed.
    """
    arg = getattr(error, "arg", None)
    if isinstance(error, CommError):  # a peer rank died or hung: this rank stops too, saying why
        message = f"stopping, the ranks' group is broken: {error}"
    elif isinstance(error, UsageError) and error.expected and arg in getattr(args, "api_options", ()):
        message = f"argument --{arg.replace('_', '-')}: expected {error.expected}, got {error.got!r}"
    else:
        message = str(error)
    return " ".join(message.split())


if __name__ == "__main__":
    sys.exit(main())
