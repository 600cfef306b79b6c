"""The per-op report as a rich table: one row per (layer, module, op), errors as fractions of their bounds."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

from hetero.tools.replay.report import PerOpReport

__all__ = ["print_per_op"]


def _fraction(x: float) -> str:
    return "inf" if not math.isfinite(x) else f"{x:.3f}"


def print_per_op(
    console: Console,
    report: PerOpReport,
    stream_first_bad: str | None = None,
    *,
    all_rows: bool = False,
    limit: int = 40,
) -> None:
    """The table (worst rows first unless ``all_rows``: every row in call order), what was skipped, the verdict."""
    every = rows = report.rows
    if not all_rows:
        rows = sorted(
            rows,
            key=lambda r: (
                not r.failed,
                r.layer if r.failed and r.layer is not None else -1,
                -max(r.rel_l2, r.max_abs),
            ),
        )[:limit]
    table = Table(
        title=f"op calls replayed on cpu_ref in float64 ({report.backend}, {report.dtype}, rank {report.rank})"
    )
    for col in ("layer", "module", "op", "calls", "out of bounds", "rel L2 / bound", "max abs / bound"):
        table.add_column(col, justify="right" if col in ("calls", "out of bounds") or "/" in col else "left")
    for r in rows:
        style = "red" if r.failed else None
        mism = f" ({r.mismatched} mismatched)" if r.mismatched else ""
        table.add_row(
            "-" if r.layer is None else str(r.layer),
            r.module,
            r.op,
            str(r.calls),
            f"{r.failed}{mism}",
            _fraction(r.rel_l2),
            _fraction(r.max_abs),
            style=style,
        )
    console.print(table)
    if len(every) > len(rows):
        bad = sum(1 for r in every if r.failed) - sum(1 for r in rows if r.failed)
        console.print(f"({len(every) - len(rows)} more rows, {bad} of them out of bounds; --json lists every call)")
    recorded = f"{len(report.calls)} calls recorded ({report.recorded_bytes / 2**20:.1f} MiB)"
    skipped = ", ".join(
        f"{s['calls']} {s['op']} ({s['reason']})" for s in report.skipped if s["reason"] != "not sampled"
    )
    unsampled = sum(s["calls"] for s in report.skipped if s["reason"] == "not sampled")
    console.print(
        f"{recorded}; not replayed: {unsampled} calls outside the sample" + (f", {skipped}" if skipped else ""),
        highlight=False,
    )
    status = report.status(stream_first_bad)
    style = {"fault": "red", "inconclusive": "red", "drift": "yellow", "ok": "green"}[status]
    console.print(f"[{style}]{report.verdict(stream_first_bad)}[/{style}]", highlight=False)
    fault = report.first_fault
    if fault is not None:
        shapes = ", ".join(f"{k} {v}" for k, v in fault.shapes.items())
        console.print(
            f"next: hetero conformance {report.backend} --ops {fault.op}  (the catalog's cases of the op; if "
            f"they pass, the bug needs this call's shapes or values: outputs {shapes}, static "
            f"{fault.static}; --json lists every recorded call)",
            highlight=False,
        )
