"""The ``hetero profile`` tables: per op and phase, per layer kind and phase, and the host parts of a step."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from hetero.bench.report import format_seconds
from hetero.tools.profile._host import HOST_PARTS
from hetero.tools.profile._report import ALL, Figures, ProfileReport

__all__ = ["print_report"]


def _num(value: float | None, fmt: str, suffix: str = "") -> str:
    return "-" if value is None else format(value, fmt) + suffix


def _pct(seconds: float, total: float) -> str:
    return f"{100 * seconds / total:.1f}%" if total > 0 else "-"


def _figure_cells(f: Figures, total: float) -> list[str]:
    roof = None if f.roofline is None else 100 * f.roofline
    return [
        str(f.calls),
        format_seconds(f.seconds),
        format_seconds(f.mean),
        _pct(f.seconds, total),
        _num(f.gb_s, ".3g"),
        _num(f.tflop_s, ".3g"),
        _num(roof, ".1f", "%"),
    ]


def _op_table(report: ProfileReport, title: str, rows: dict[str, dict[str, Figures]], first: str) -> Table:
    total = report.step_seconds
    table = Table(title=title)
    for col in (first, "phase", "calls", "total", "mean", "% step", "GB/s", "TFLOP/s", "roofline"):
        table.add_column(col, justify="left" if col in (first, "phase") else "right")
    for name, phases in rows.items():
        split = len(phases) > 2  # "all" plus more than one phase: show each
        for i, (phase, f) in enumerate(phases.items()):
            if phase != ALL and not split:
                continue
            style = "bold" if phase == ALL else None
            table.add_row(
                name if i == 0 else "",
                phase,
                *_figure_cells(f, total),
                style=style,
                end_section=i == len(phases) - 1 or not split,
            )
    return table


def _host_table(report: ProfileReport) -> Table:
    host = report.host()
    phases = list(host)
    table = Table(title="engine host time per step (mean seconds per step; % of all step time)")
    table.add_column("part")
    for phase in phases:
        table.add_column(f"{phase} ({host[phase]['steps']} steps)", justify="right")
    table.add_column("% step", justify="right")
    total = host[ALL]["step"]
    for part in ("step", *HOST_PARTS):
        if part == "device wait" and host[ALL][part] == 0.0:
            continue  # the CPU has none
        cells = [format_seconds(host[p][part] / host[p]["steps"]) if host[p]["steps"] else "-" for p in phases]
        table.add_row(
            part,
            *cells,
            _pct(host[ALL][part], total),
            style="bold" if part == "step" else None,
            end_section=part == "step",
        )
    return table


def _notes(report: ProfileReport) -> list[str]:
    notes = []
    if report.ceilings is None:
        notes.append(f"roofline -: {report.ceilings_note or 'device ceilings unknown'}")
    else:
        notes.append(f"roofline: {report.ceilings.name} ({report.ceilings.source})")
    for op, why in report.no_model.items():
        notes.append(f"GB/s, TFLOP/s -: {op}: no byte/flop figure ({why})")
    return notes


def print_report(console: Console, report: ProfileReport, title: str = "") -> None:
    """The op table (a row per op, and per phase when both ran), the layer-kind table, the host table, the notes."""
    run = report.run
    head = title or f"hetero profile on {report.device}"
    if run:
        head += (
            f": {run.get('requests')} requests, {run.get('prompt_tokens')} prompt + {run.get('output_tokens')} "
            f"output tokens, {run.get('steps')} steps"
        )
    console.print(head, highlight=False, markup=False)
    timing = "host clock, GC paused" if report.timing == "perf_counter" else "device events"
    console.print(_op_table(report, f"ops ({len(report.calls)} calls; time: {timing})", report.ops(), "op"))
    console.print(_op_table(report, "by layer type", report.layers(), "layer"))
    if report.steps:
        console.print(_host_table(report))
    for note in _notes(report):
        console.print(note, style="dim", highlight=False, markup=False)
