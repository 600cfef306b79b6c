"""Markdown pieces shared by the conformance report and its robustness section."""

from __future__ import annotations

from typing import Any, Iterable

__all__ = ["cell", "failure_details"]


def cell(text: Any) -> str:
    """``text`` as one Markdown table cell: pipes escaped, newlines folded."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def failure_details(failing: Iterable[tuple[str, str, str]], noun: str, max_failures: int) -> list[str]:
    """A collapsed table of (id, status, message) rows, at most ``max_failures`` shown; [] when none."""
    rows = list(failing)
    if not rows:
        return []
    lines = [
        "",
        f"<details><summary>{len(rows)} failing {noun}(s)</summary>",
        "",
        f"| {noun} | status | message |",
        "|---|---|---|",
    ]
    lines += [f"| `{i}` | {status} | {cell(message[:300])} |" for i, status, message in rows[:max_failures]]
    if len(rows) > max_failures:
        lines.append(f"| ... | | {len(rows) - max_failures} more in the JSON report |")
    return lines + ["", "</details>"]
