"""The progress bar of a run: cases (or malformed calls) done, failing so far, the one running."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

from hetero_conformance.runner import FAILING

__all__ = ["progress"]


@contextmanager
def progress(console: Any, total: int) -> Iterator[tuple[Callable[[Any], None], Callable[[Any], None]]]:
    """``(started(case), finished(result))`` callbacks driving a bar on ``console`` (None: silent)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("[bold]conformance[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[case]}"),
    )
    failing = [0]
    with Progress(*columns, console=console, transient=True, disable=console is None) as bar:
        task = bar.add_task("cases", total=total, case="")

        def started(case: Any) -> None:
            bar.update(task, case=case.id)

        def finished(result: Any) -> None:  # a CaseResult, or a robustness CallResult (which says ok)
            failing[0] += not result.ok if hasattr(result, "ok") else result.status in FAILING
            bar.update(task, advance=1, case=f"[red]{failing[0]} failing[/]" if failing[0] else "")

        yield started, finished
