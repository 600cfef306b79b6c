"""The transient progress bar of ``LLM.generate``."""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator

__all__ = ["progress_bar"]


@contextlib.contextmanager
def progress_bar(enabled: bool, total: int) -> Iterator[Callable[[int, int], None]]:
    """A transient rich bar of finished requests and generated tokens per second (a no-op when disabled)."""
    if not enabled:
        yield lambda done, tokens: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    start = time.perf_counter()
    columns = (
        TextColumn("generating"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[rate]}"),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("generate", total=total, rate="")

        def advance(done: int, tokens: int) -> None:
            rate = tokens / max(time.perf_counter() - start, 1e-9)
            bar.update(task, advance=done, rate=f"{rate:.1f} tok/s")

        yield advance
