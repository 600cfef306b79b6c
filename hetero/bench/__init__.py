"""Operator benchmarks: timing, byte/flop models, device ceilings and the shared baseline format.

``hetero bench NAME`` times every op of a backend on performance shapes; the
baseline format in :mod:`hetero.bench.baseline` is shared with ``hetero bench-engine``.
"""

from __future__ import annotations

from hetero.bench.baseline import (
    SCHEMA,
    BaselineError,
    Comparison,
    Metric,
    check_environment,
    compare,
    confirm,
    environment,
    load_baseline,
    save_baseline,
)

__all__ = [
    "SCHEMA",
    "Metric",
    "Comparison",
    "BaselineError",
    "environment",
    "save_baseline",
    "load_baseline",
    "check_environment",
    "compare",
    "confirm",
]
