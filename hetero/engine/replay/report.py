"""The per-op verdict of a run: a row per (layer, module, op), the first call out of tolerance, or drift."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hetero.engine.replay.replayer import CallVerdict

__all__ = ["OpRow", "PerOpReport"]


@dataclass
class OpRow:
    """Every replayed call of one op at one site: the worst rel L2 and max abs, each as a fraction of its bound."""

    layer: int | None
    module: str
    op: str
    calls: int = 0
    failed: int = 0
    rel_l2: float = 0.0
    max_abs: float = 0.0
    mismatched: int = 0

    def add(self, v: CallVerdict) -> None:
        self.calls += 1
        self.failed += not v.ok
        for m in v.outputs.values():
            if m.get("kind") == "float":
                self.rel_l2 = max(self.rel_l2, _ratio(m["rel_l2"], m["bound_rel_l2"]))
                self.max_abs = max(self.max_abs, _ratio(m["max_abs"], m["bound_max_abs"]))
            else:
                self.mismatched += int(m.get("mismatched", 0))


def _ratio(err: float, bound: float) -> float:
    if math.isnan(err):
        return math.inf
    return err / bound if bound else (math.inf if err else 0.0)


@dataclass
class PerOpReport:
    """Replayed calls (``calls``, in call order), what was not recorded (``skipped``: op, reason, calls)."""

    backend: str
    dtype: str
    calls: list[CallVerdict]
    skipped: list[dict[str, Any]] = field(default_factory=list)
    recorded_bytes: int = 0
    rank: int = 0

    @property
    def rows(self) -> list[OpRow]:
        rows: dict[tuple[str, str], OpRow] = {}
        for v in self.calls:
            key = (v.path, v.op)
            if key not in rows:
                rows[key] = OpRow(v.layer, v.module, v.op)
            rows[key].add(v)
        return list(rows.values())

    @property
    def first_fault(self) -> CallVerdict | None:
        """The first op call (in the run's order) out of tolerance."""
        return next((v for v in self.calls if not v.ok), None)

    @property
    def passed(self) -> bool:
        return self.first_fault is None

    def verdict(self, stream_first_bad: str | None = None) -> str:
        """One sentence: the op at fault, or (every replayed call within bounds) drift or agreement."""
        f = self.first_fault
        if f is not None:
            where = f"layer {f.layer} ({f.path})" if f.layer is not None else f.path
            return f"op at fault: {f.op} in {where}, call #{f.index} of the run: {f.problems[0]}"
        if stream_first_bad is not None:
            return (f"accumulated rounding, no op at fault: all {len(self.calls)} replayed op calls are within their "
                    f"conformance bounds while the residual stream drifts from {stream_first_bad}")
        return f"no op at fault: all {len(self.calls)} replayed op calls are within their conformance bounds"

    def as_dict(self, stream_first_bad: str | None = None) -> dict[str, Any]:
        f = self.first_fault
        return {
            "backend": self.backend, "dtype": self.dtype, "rank": self.rank, "passed": self.passed,
            "verdict": self.verdict(stream_first_bad),
            "first_fault": None if f is None else {"index": f.index, "layer": f.layer, "module": f.module, "op": f.op,
                                                   "path": f.path, "problems": f.problems},
            "rows": [{"layer": r.layer, "module": r.module, "op": r.op, "calls": r.calls, "failed": r.failed,
                      "rel_l2_of_bound": _num(r.rel_l2), "max_abs_of_bound": _num(r.max_abs), "mismatched": r.mismatched}
                     for r in self.rows],
            "calls": [{"index": v.index, "layer": v.layer, "module": v.module, "op": v.op, "ok": v.ok,
                       "static": v.static, "shapes": v.shapes, "outputs": v.outputs, "problems": v.problems} for v in self.calls],
            "skipped": self.skipped, "recorded_bytes": self.recorded_bytes,
        }


def _num(x: float) -> float | str:
    return x if math.isfinite(x) else "inf"
