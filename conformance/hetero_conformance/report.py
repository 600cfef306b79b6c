"""Reports of a conformance run: JSON (schema in report.schema.json), JUnit XML, Markdown and a rich table.

The JSON layout is documented field by field in docs/conformance-report.md.
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

from hetero.spec import OP_NAMES
from hetero.verify.case import DTYPES
from hetero_conformance import robustness_report
from hetero_conformance._markdown import cell, failure_details
from hetero_conformance.runner import FAILING, CaseResult
from hetero_conformance.suite import SuiteResult

__all__ = [
    "SCHEMA_VERSION",
    "schema",
    "to_json",
    "write_json",
    "to_junit",
    "write_junit",
    "to_markdown",
    "write_markdown",
    "summary_rows",
    "print_summary",
]

#: Major: a field changed meaning or was removed. Minor: fields were added (1.1: the robustness tier).
SCHEMA_VERSION = "1.1"
#: A report without the robustness tier has no field added since 1.0, and says so.
_BASE_VERSION = "1.0"
_SKIPPING = ("skipped", "fallback")
_COUNTS = ("passed", "failed", "skipped", "fallback")


def schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) every JSON report validates against."""
    return json.loads(resources.files("hetero_conformance").joinpath("report.schema.json").read_text(encoding="utf-8"))


def _plain(value: Any) -> Any:
    """JSON-safe: non-finite floats become the strings "inf", "-inf" and "nan"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def to_json(suite: SuiteResult) -> dict[str, Any]:
    """The report as a JSON-ready dict (schema version SCHEMA_VERSION)."""
    counts = suite.counts()
    summary = {"total": len(suite.results), **counts, "ok": suite.ok}
    doc = {
        "schema_version": _BASE_VERSION,
        **suite.meta,
        "summary": summary,
        "cases": [r.as_dict() for r in suite.results],
    }
    if suite.robustness is not None:
        doc.update(schema_version=SCHEMA_VERSION, robustness=suite.robustness.as_dict())
    return _plain(doc)


def write_json(suite: SuiteResult, path: str | Path) -> None:
    """Write the JSON report to ``path``."""
    Path(path).write_text(json.dumps(to_json(suite), indent=2, allow_nan=False) + "\n", encoding="utf-8")


def worst(result: CaseResult) -> tuple[float, str] | None:
    """The case's largest error as a fraction of its bound, with a short text; None if nothing was compared."""
    best: tuple[float, str] | None = None
    for name, m in result.outputs.items():
        if m.get("kind") == "float":
            pairs = (
                ("max_abs", m.get("max_abs"), m.get("bound_max_abs")),
                ("rel_l2", m.get("rel_l2"), m.get("bound_rel_l2")),
            )
            cands = [
                (_ratio(err, bound), f"{name} {metric} {err:.2g} / {bound:.2g}")
                for metric, err, bound in pairs
                if err is not None and bound is not None
            ]
        else:
            mism, numel = m.get("mismatched", 0), m.get("numel", 0)
            cands = [(math.inf if mism else 0.0, f"{name} {mism}/{numel} differ")]
        for cand in cands:
            if best is None or cand[0] > best[0]:
                best = cand
    return best


def _ratio(err: float, bound: float) -> float:
    if isinstance(err, str) or isinstance(bound, str) or math.isnan(err):
        return math.inf
    return err / bound if bound > 0 else (0.0 if err == 0 else math.inf)


def summary_rows(results: Iterable[CaseResult]) -> list[dict[str, Any]]:
    """One row per (op, dtype), in spec and dtype order: passed/failed/skipped/fallback and the worst error."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for r in results:
        empty = {
            "op": r.op,
            "dtype": r.dtype,
            "passed": 0,
            "failed": 0,
            "skipped": 0,
            "fallback": 0,
            "worst": None,
            "worst_case": "",
        }
        row = rows.setdefault((r.op, r.dtype), empty)
        key = "passed" if r.status == "pass" else "failed" if r.status in FAILING else r.status
        row[key] += 1
        w = worst(r)
        if w is not None and (row["worst"] is None or w[0] > row["worst"][0]):
            row["worst"], row["worst_case"] = w, r.id
    return sorted(rows.values(), key=lambda row: (_index(OP_NAMES, row["op"]), _index(tuple(DTYPES), row["dtype"])))


def _index(seq: tuple[str, ...], item: str) -> int:
    return seq.index(item) if item in seq else len(seq)


def _worst_text(row: dict[str, Any]) -> str:
    if row["worst"] is None:
        return "-"
    ratio, text = row["worst"]
    return f"{ratio:.2f}x: {text}" if math.isfinite(ratio) else f"over: {text}"


def _headline(suite: SuiteResult) -> str:
    b, env, run = suite.meta["backend"], suite.meta["environment"], suite.meta["run"]
    size = f"{len(suite.robustness.calls)} calls" if suite.robustness is not None else f"{len(suite.results)} cases"
    return (
        f"backend {b['name']} ({b['package'] or '?'} {b['version']}) on {b['device_name'] or b['device']}; "
        f"spec {suite.meta['spec_version']}; "
        f"torch {env['torch']}; seed {run['seed']}; {run['tier']} tier; {size} in {run['duration_s']:.1f} s"
    )


def _counts_text(suite: SuiteResult) -> str:
    parts = [", ".join(f"{n} {s}" for s, n in suite.counts().items() if n)]
    if suite.robustness is not None:
        parts.append(robustness_report.counts_text(suite.robustness))
    return "; ".join(p for p in parts if p)


def to_junit(suite: SuiteResult) -> ET.ElementTree:
    """JUnit XML: one <testsuite> per op family, one <testcase> per case (classname backend.op)."""
    backend = suite.meta["backend"]["name"]
    root = ET.Element("testsuites", name=f"hetero conformance {backend}")
    families: dict[str, list[CaseResult]] = {}
    for r in suite.results:
        families.setdefault(r.family or "unknown", []).append(r)
    for family, results in families.items():
        node = ET.SubElement(
            root, "testsuite", name=f"hetero_conformance.{backend}.{family}", timestamp=suite.meta["run"]["started_at"]
        )
        props = ET.SubElement(node, "properties")
        meta = suite.meta
        for key, value in (
            ("spec_version", meta["spec_version"]),
            ("backend_version", meta["backend"]["version"]),
            ("device", meta["backend"]["device_name"]),
            ("torch", meta["environment"]["torch"]),
            ("seed", meta["run"]["seed"]),
        ):
            ET.SubElement(props, "property", name=key, value=str(value))
        for r in results:
            _junit_case(node, backend, r)
        _tally(node, results)
    if suite.robustness is not None:
        robustness_report.junit_suite(root, backend, suite.robustness, suite.meta["run"]["started_at"])
    for key in ("tests", "failures", "errors", "skipped"):
        root.set(key, str(sum(int(node.get(key, 0)) for node in root)))
    root.set("time", f"{sum(float(node.get('time', 0)) for node in root):.3f}")
    ET.indent(root)
    return ET.ElementTree(root)


def _junit_case(parent: ET.Element, backend: str, r: CaseResult) -> None:
    tc = ET.SubElement(
        parent, "testcase", classname=f"{backend}.{r.op}", name=f"{r.shape}/{r.dtype}", time=f"{r.seconds:.4f}"
    )
    if r.status == "fail":
        ET.SubElement(tc, "failure", message=r.message[:500], type="fail").text = (
            r.message + "\n" + json.dumps(_plain(r.outputs), indent=1)
        )
    elif r.status in FAILING:
        ET.SubElement(tc, "error", message=r.message[:500], type=r.status).text = r.message
    elif r.status in _SKIPPING:
        ET.SubElement(tc, "skipped", message=f"{r.status}: {r.message}"[:500])


def _tally(node: ET.Element, results: list[CaseResult]) -> None:
    node.set("tests", str(len(results)))
    node.set("failures", str(sum(r.status == "fail" for r in results)))
    node.set("errors", str(sum(r.status in FAILING and r.status != "fail" for r in results)))
    node.set("skipped", str(sum(r.status in _SKIPPING for r in results)))
    node.set("time", f"{sum(r.seconds for r in results):.3f}")


def write_junit(suite: SuiteResult, path: str | Path) -> None:
    """Write the JUnit XML report to ``path``."""
    to_junit(suite).write(str(path), encoding="utf-8", xml_declaration=True)


def to_markdown(suite: SuiteResult, *, max_failures: int = 50) -> str:
    """A Markdown summary for a pull-request comment: verdict, op x dtype table, failing cases."""
    verdict = ":white_check_mark: passed" if suite.ok else ":x: failed"
    lines = [f"### hetero conformance: `{suite.meta['backend']['name']}` {verdict}", "", cell(_headline(suite)), ""]
    lines += [f"**{cell(_counts_text(suite)) or 'no cases'}**", ""]
    if suite.robustness is not None and not suite.results:
        return "\n".join(lines + robustness_report.markdown_lines(suite.robustness)) + "\n"
    lines += [
        "| op | dtype | passed | failed | skipped | fallback | worst error / bound |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for row in summary_rows(suite.results):
        lines.append(
            f"| {row['op']} | {row['dtype']} | {row['passed']} | {row['failed']} | {row['skipped']} | "
            f"{row['fallback']} | {cell(_worst_text(row))} |"
        )
    lines += failure_details(
        ((r.id, r.status, r.message) for r in suite.results if r.status in FAILING), "case", max_failures
    )
    if suite.robustness is not None:
        lines += [""] + robustness_report.markdown_lines(suite.robustness)
    return "\n".join(lines) + "\n"


def write_markdown(suite: SuiteResult, path: str | Path) -> None:
    """Write the Markdown report to ``path``."""
    Path(path).write_text(to_markdown(suite), encoding="utf-8")


def print_summary(console: Any, suite: SuiteResult, *, max_failures: int = 30) -> None:
    """The terminal summary: op x dtype table, then the failing cases and the verdict."""
    from rich.markup import escape
    from rich.table import Table

    if suite.robustness is not None:
        robustness_report.print_tables(console, suite.meta["backend"]["name"], suite.robustness)
    if suite.robustness is not None and not suite.results:
        style = "green" if suite.ok else "red"
        console.print(escape(_headline(suite)), style="dim", highlight=False)
        console.print(
            f"[{style}]{'PASSED' if suite.ok else 'FAILED'}[/]: {escape(_counts_text(suite))}", highlight=False
        )
        return
    table = Table(title=f"hetero conformance: {suite.meta['backend']['name']}", caption=escape(_headline(suite)))
    for col in ("op", "dtype", "passed", "failed", "skipped", "fallback", "worst error / bound"):
        table.add_column(
            col, justify="right" if col in _COUNTS else "left", overflow="fold", no_wrap=col in ("op", "dtype")
        )
    for row in summary_rows(suite.results):
        failed = f"[red]{row['failed']}[/]" if row["failed"] else "0"
        table.add_row(
            row["op"],
            row["dtype"],
            f"[green]{row['passed']}[/]",
            failed,
            str(row["skipped"]),
            str(row["fallback"]),
            escape(_worst_text(row)),
        )
    console.print(table)
    failing = [r for r in suite.results if r.status in FAILING]
    for r in failing[:max_failures]:
        console.print(f"[red]{r.status.upper()}[/] {escape(r.id)}: {escape(r.message)}", highlight=False)
    if len(failing) > max_failures:
        console.print(f"... and {len(failing) - max_failures} more failing cases (see --json)")
    style = "green" if suite.ok else "red"
    console.print(
        f"[{style}]{'PASSED' if suite.ok else 'FAILED'}[/]: {_counts_text(suite) or 'no cases'}", highlight=False
    )
