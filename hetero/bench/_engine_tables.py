"""The tables of ``hetero bench-engine`` (``hetero.bench.engine_report``): a run's summary (throughput,
KV-cache use, latency percentiles) and its comparison with a baseline, which ``hetero bench-serve``
prints too.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from rich.console import Console
from rich.table import Table

from hetero.bench.baseline import Comparison

__all__ = ["print_comparison", "print_summary"]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.2f}"


def print_summary(console: Console, summary: Mapping[str, Any], title: str) -> None:
    kv = summary["kv_cache"]
    console.print(title, highlight=False, markup=False)
    table = Table()
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("requests/s", f"{summary['request_throughput']:.2f}"),
        ("output tok/s", f"{summary['output_throughput']:.1f}"),
        ("total tok/s (prompt + output)", f"{summary['total_throughput']:.1f}"),
        (
            "requests / prompt tokens / output tokens",
            f"{summary['requests']} / {summary['prompt_tokens']} / {summary['output_tokens']}",
        ),
        ("elapsed s", f"{summary['elapsed_s']:.2f}"),
        (
            "KV cache utilization mean / peak",
            f"{kv['mean_utilization']:.1%} / {kv['peak_utilization']:.1%} of {kv['num_blocks']} blocks",
        ),
        ("preemptions", str(summary["preemptions"])),
        ("prefix-cache hit tokens", str(summary["cached_prompt_tokens"])),
        ("steps", str(summary["steps"])),
    ]
    spec = summary.get("spec_decode")
    if spec is not None:
        per_pos = " / ".join(f"{r:.0%}" for r in spec["acceptance_rate_per_position"]) or "-"
        rows += [
            (
                "drafts / draft tokens / accepted",
                f"{spec['num_drafts']} / {spec['num_draft_tokens']} / {spec['num_accepted_tokens']}",
            ),
            (
                "acceptance rate / mean acceptance length",
                f"{spec['acceptance_rate']:.1%} / {spec['mean_acceptance_length']:.2f}",
            ),
            ("acceptance per draft position", per_pos),
        ]
    for row in rows:
        table.add_row(*row)
    console.print(table)
    latency = Table(title="latency (ms)")
    for col in ("", "mean", "p50", "p90", "p99"):
        latency.add_column(col, justify="right" if col else "left")
    for label, key in (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("end-to-end", "e2e_s")):
        latency.add_row(label, *(_ms(summary[key][q]) for q in ("mean", "p50", "p90", "p99")))
    console.print(latency)


def print_comparison(
    console: Console, comparisons: Sequence[Comparison], units: Mapping[str, str], threshold: float
) -> None:
    table = Table(title=f"against the baseline (regression: more than {threshold:.0%} worse)")
    for col in ("metric", "unit", "baseline", "current", "change", "spread of runs (min/median/max)", ""):
        table.add_column(col, justify="left" if col in ("metric", "unit", "") else "right")
    for c in comparisons:
        spread = "-" if c.spread is None else " / ".join(f"{v:.2f}" for v in c.spread)
        status = "[red]regressed[/]" if c.regressed else (c.note or "[green]ok[/]")
        change = "-" if math.isnan(c.change) else f"{c.change:+.1%}"
        table.add_row(c.name, units.get(c.name, ""), f"{c.baseline:.2f}", f"{c.current:.2f}", change, spread, status)
    console.print(table)
