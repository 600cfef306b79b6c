"""``--plot F.png``: time per op (against the baseline when comparing) and the roofline fraction when known.

matplotlib is an optional extra (``pip install 'hetero[plot]'``); the figure is
drawn on a bare ``matplotlib.figure.Figure``, so no pyplot state is touched.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from hetero.bench.baseline import Comparison
from hetero.bench.ops import OpResult

__all__ = ["PlotUnavailable", "require_matplotlib", "plot"]


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def require_matplotlib() -> Any:
    """The ``matplotlib.figure`` module, or :class:`PlotUnavailable` telling how to install it."""
    try:
        import matplotlib.figure
    except ModuleNotFoundError as e:
        if e.name is None or not e.name.startswith("matplotlib"):
            raise
        raise PlotUnavailable(
            "--plot needs matplotlib: pip install 'hetero[plot]' (or pip install matplotlib)"
        ) from None
    return matplotlib.figure


def _times(ax: Any, rows: Sequence[OpResult], comparisons: Mapping[str, Comparison] | None) -> None:
    labels = [f"{r.op}\n{r.shape.removeprefix('perf/')}" for r in rows]
    y = range(len(rows))
    ms = [r.seconds * 1e3 for r in rows]
    base = [comparisons.get(r.case_id) if comparisons else None for r in rows]
    regressed = [c is not None and c.regressed for c in base]
    colors = ["tab:red" if bad else "tab:blue" for bad in regressed]
    height = 0.4 if comparisons else 0.8
    ax.barh([i + (height / 2 if comparisons else 0) for i in y], ms, height=height, color=colors, label="this run")
    if comparisons:
        old = [c.baseline * 1e3 if c is not None and not math.isnan(c.baseline) else 0.0 for c in base]
        ax.barh([i - height / 2 for i in y], old, height=height, color="tab:gray", label="baseline")
        from matplotlib.patches import Patch

        ax.legend(
            handles=[
                Patch(color="tab:blue", label="this run"),
                Patch(color="tab:red", label="regressed"),
                Patch(color="tab:gray", label="baseline"),
            ],
            loc="lower right",
        )
    ax.set_yticks(list(y), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("median time per call (ms, log scale)")


def _roofline(ax: Any, rows: Sequence[OpResult]) -> None:
    y = range(len(rows))
    pct = [100 * r.roofline if r.roofline is not None else 0.0 for r in rows]
    ax.barh(list(y), pct, color="tab:green")
    ax.set_yticks(list(y), [""] * len(rows))
    ax.invert_yaxis()
    ax.set_xlim(0, max(100.0, max(pct, default=0.0) * 1.05))
    ax.set_xlabel("fraction of the roofline (%)")


def plot(
    path: str | Path, results: Sequence[OpResult], comparisons: Mapping[str, Comparison] | None, title: str
) -> None:
    """Write the figure to ``path`` (the format from its suffix, e.g. .png)."""
    figure = require_matplotlib()
    rows = [r for r in results if r.seconds is not None]
    with_roofline = any(r.roofline is not None for r in rows)
    fig = figure.Figure(figsize=(11 if with_roofline else 8, 1.2 + 0.45 * max(len(rows), 1)), layout="constrained")
    axes = fig.subplots(1, 2 if with_roofline else 1, squeeze=False, width_ratios=[3, 1] if with_roofline else [1])[0]
    _times(axes[0], rows, comparisons)
    if with_roofline:
        _roofline(axes[1], rows)
    fig.suptitle(title, fontsize=10)
    fig.savefig(Path(path), dpi=120)
