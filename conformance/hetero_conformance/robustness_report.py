"""The robustness tier in the reports: JSON section, JUnit testsuite, Markdown and terminal tables."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any, Iterable

from hetero.spec import OP_NAMES
from hetero_conformance._markdown import cell, failure_details
from hetero_conformance.robustness import STATUSES, CallResult, RobustnessResult

__all__ = ["COLUMNS", "rows", "mode", "counts_text", "junit_suite", "markdown_lines", "print_tables"]

#: The per-op table's count columns, after ``op`` and ``calls``.
COLUMNS = ("rejected", "silent", "unclear", "crashed", "timeout", "fallback", "failed")
_ERRORS = ("crashed", "timeout")


def rows(calls: Iterable[CallResult]) -> list[dict[str, Any]]:
    """One row per op, in spec order: its number of calls, calls per status and failing calls."""
    table: dict[str, dict[str, Any]] = {}
    for c in calls:
        row = table.setdefault(c.op, {"op": c.op, "calls": 0, **dict.fromkeys(COLUMNS, 0)})
        row["calls"] += 1
        row[c.status] += 1
        row["failed"] += not c.ok
    order = {op: i for i, op in enumerate(OP_NAMES)}
    return sorted(table.values(), key=lambda r: order.get(r["op"], len(order)))


def mode(rob: RobustnessResult) -> str:
    return "validation on" if rob.validate else "validation off: silent passes for index-content defects"


def counts_text(rob: RobustnessResult) -> str:
    counts = rob.counts()
    text = ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts[s])
    return f"{len(rob.calls)} malformed calls ({mode(rob)}): {text or 'none'}; {counts['failed']} failing"


def junit_suite(root: ET.Element, backend: str, rob: RobustnessResult, started_at: str) -> ET.Element:
    """Add ``<testsuite name="hetero_conformance.BACKEND.robustness">``: one testcase per call."""
    node = ET.SubElement(root, "testsuite", name=f"hetero_conformance.{backend}.robustness", timestamp=started_at)
    props = ET.SubElement(node, "properties")
    ET.SubElement(props, "property", name="validate", value=str(rob.validate).lower())
    for c in rob.calls:
        tc = ET.SubElement(
            node, "testcase", classname=f"{backend}.{c.op}", name=f"robustness/{c.defect}", time=f"{c.seconds:.4f}"
        )
        if c.status == "fallback":
            ET.SubElement(tc, "skipped", message=f"fallback: {c.message}"[:500])
        elif not c.ok:
            kind = "error" if c.status in _ERRORS else "failure"
            ET.SubElement(tc, kind, message=c.message[:500], type=c.status).text = c.message
    node.set("tests", str(len(rob.calls)))
    node.set("failures", str(sum(not c.ok and c.status not in _ERRORS for c in rob.calls)))
    node.set("errors", str(sum(not c.ok and c.status in _ERRORS for c in rob.calls)))
    node.set("skipped", str(sum(c.status == "fallback" for c in rob.calls)))
    node.set("time", f"{sum(c.seconds for c in rob.calls):.3f}")
    return node


def markdown_lines(rob: RobustnessResult, *, max_failures: int = 50) -> list[str]:
    """The robustness section of the Markdown summary: per-op counts, then the failing calls."""
    cost = f"{rob.per_call_s * 1000:.0f} ms per call, worker start-up {rob.startup_s:.1f} s"
    lines = ["#### Robustness", "", f"{len(rob.calls)} malformed calls, {cell(mode(rob))}; {cost}", ""]
    lines += ["| op | calls | " + " | ".join(COLUMNS) + " |", "|---|---:|" + "---:|" * len(COLUMNS)]
    lines += [f"| {r['op']} | {r['calls']} | " + " | ".join(str(r[k]) for k in COLUMNS) + " |" for r in rows(rob.calls)]
    lines += failure_details(((c.id, c.status, c.message) for c in rob.calls if not c.ok), "call", max_failures)
    return lines


def print_tables(console: Any, backend: str, rob: RobustnessResult, *, max_failures: int = 30) -> None:
    """The terminal view: the per-op table, then the failing calls."""
    from rich.markup import escape
    from rich.table import Table

    caption = f"{mode(rob)}; {rob.per_call_s * 1000:.0f} ms per call, worker start-up {rob.startup_s:.1f} s"
    table = Table(title=f"hetero conformance --robustness: {backend}", caption=escape(caption))
    table.add_column("op", no_wrap=True)
    for col in ("calls", *COLUMNS):
        table.add_column(col, justify="right")
    for r in rows(rob.calls):
        cells = [
            f"[red]{r[k]}[/]" if r[k] and k in ("unclear", "crashed", "timeout", "failed") else str(r[k])
            for k in COLUMNS
        ]
        table.add_row(r["op"], str(r["calls"]), *cells)
    console.print(table)
    failing = [c for c in rob.calls if not c.ok]
    for c in failing[:max_failures]:
        console.print(f"[red]{c.status.upper()}[/] {escape(c.id)}: {escape(c.message)}", highlight=False)
    if len(failing) > max_failures:
        console.print(f"... and {len(failing) - max_failures} more failing calls (see --json)")
