"""The ``hetero bench`` report: a rich table per run, the reasons behind every "-", and the JSON form."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from rich.console import Console
from rich.table import Table

from hetero.bench.baseline import Comparison
from hetero.bench.devices import Ceilings
from hetero.bench.ops import DECLINED, ERROR, FALLBACK, NATIVE, SKIPPED, OpResult

__all__ = ["format_seconds", "results_table", "print_report", "report_dict", "verdict"]

_STATUS_STYLE = {NATIVE: "green", FALLBACK: "yellow", DECLINED: "yellow", SKIPPED: "dim", ERROR: "red"}


def format_seconds(s: float | None) -> str:
    """Seconds in the unit that keeps three significant digits readable (ns, us, ms, s)."""
    if s is None or math.isnan(s):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def verdict(c: Comparison, threshold: float) -> str:
    """ok | REGRESSED | faster | new | missing: the comparison of one metric in words."""
    if c.note:
        return "new" if math.isnan(c.baseline) else "missing"
    if c.regressed:
        return "REGRESSED"
    return "faster" if c.change < -threshold else "ok"


def _compare_cells(c: Comparison | None, threshold: float) -> list[str]:
    if c is None:
        return ["-", "-", "-"]
    word = verdict(c, threshold)
    style = {"REGRESSED": "bold red", "faster": "green", "ok": "green"}.get(word, "dim")
    change = "-" if math.isnan(c.change) else f"{c.change:+.0%}"
    if c.spread is not None:  # re-measured: the best value is kept, the range shows the noise
        change += f" (re-measured {format_seconds(c.spread[0])}..{format_seconds(c.spread[2])})"
    return [format_seconds(c.baseline), change, f"[{style}]{word}[/]"]


def results_table(
    results: Sequence[OpResult],
    comparisons: Mapping[str, Comparison] | None = None,
    threshold: float = 0.1,
    title: str = "",
) -> Table:
    """One row per case: time, GB/s, TFLOP/s, x ref, roofline %, and the baseline columns when comparing."""
    table = Table(title=title or None)
    columns = ["op", "shape", "dtype", "impl", "time", "GB/s", "TFLOP/s", "x ref", "roofline"]
    if comparisons is not None:
        columns += ["baseline", "change", "verdict"]
    for col in columns:
        table.add_column(col, justify="right" if col not in ("op", "shape", "dtype", "impl", "verdict") else "left")
    for r in results:
        style = _STATUS_STYLE.get(r.status, "")
        row = [
            r.op,
            r.shape,
            r.dtype,
            f"[{style}]{r.status}[/]",
            format_seconds(r.seconds),
            _num(r.gb_s, ".3g"),
            _num(r.tflops, ".3g"),
            _num(r.speedup, ".2f") + ("x" if r.speedup is not None else ""),
            _num(None if r.roofline is None else 100 * r.roofline, ".1f") + ("%" if r.roofline is not None else ""),
        ]
        if comparisons is not None:
            row += _compare_cells(comparisons.get(r.case_id), threshold)
        table.add_row(*row)
    return table


def _notes(results: Sequence[OpResult]) -> list[str]:
    """Why a column shows "-" or an op was not measured natively, each reason once, with its ops
    (left out when the reason covers every timed op)."""
    notes: dict[str, list[str]] = {}
    for r in results:
        if r.note:
            notes.setdefault(f"{r.status}: {r.note}", []).append(r.op)
        if r.timing is not None and r.reference is None and r.reference_note:
            notes.setdefault(f"x ref -: {r.reference_note}", []).append(r.op)
        if r.timing is not None and r.roofline is None and r.roofline_note:
            notes.setdefault(f"roofline -: {r.roofline_note}", []).append(r.op)
    timed = [r.op for r in results if r.timing is not None]
    return [text if ops == timed else f"{text} ({', '.join(dict.fromkeys(ops))})" for text, ops in notes.items()]


def print_report(
    console: Console,
    results: Sequence[OpResult],
    *,
    header: str,
    comparisons: Mapping[str, Comparison] | None = None,
    threshold: float = 0.1,
) -> None:
    """The table, then one line per reason behind a "-" or a non-native op."""
    console.print(results_table(results, comparisons, threshold, title=header))
    for line in _notes(results):
        console.print(f"  {line}", style="dim", highlight=False, markup=False)


def _comparison_dict(c: Comparison) -> dict[str, Any]:
    clean = lambda x: None if x is None or (isinstance(x, float) and math.isnan(x)) else x  # noqa: E731
    return {
        "name": c.name,
        "baseline": clean(c.baseline),
        "current": clean(c.current),
        "change": clean(c.change),
        "regressed": c.regressed,
        "spread": list(c.spread) if c.spread else None,
        "note": c.note,
    }


def report_dict(
    results: Sequence[OpResult],
    env: dict,
    ceilings: Ceilings | None,
    ceilings_note: str,
    comparisons: Sequence[Comparison] | None,
    threshold: float,
) -> dict[str, Any]:
    """The JSON report of one run (``--json``)."""
    return {
        "environment": env,
        "ceilings": None
        if ceilings is None
        else {"name": ceilings.name, "tflops": dict(ceilings.tflops), "tb_s": ceilings.tb_s, "source": ceilings.source},
        "ceilings_note": ceilings_note,
        "results": [r.as_dict() for r in results],
        "comparison": None
        if comparisons is None
        else {
            "threshold": threshold,
            "metrics": [_comparison_dict(c) for c in comparisons],
            "regressed": [c.name for c in comparisons if c.regressed],
        },
    }
