"""The per-op verdict of a run: a row per call site, the first call out of tolerance, drift, or not enough seen."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hetero.tools.replay.recorder import Located
from hetero.tools.replay.replayer import CallVerdict, finite

__all__ = ["OpRow", "PerOpReport", "STATUSES"]

#: the verdicts: an op call out of bounds; some call site never judged; the stream drifts with every op within
#: bounds; everything within bounds
STATUSES = ("fault", "inconclusive", "drift", "ok")


@dataclass
class OpRow(Located):
    """Every replayed call of one op call site: the worst rel L2 and max abs, each as a fraction of its bound."""

    path: str
    op: str
    calls: int = 0
    failed: int = 0
    errors: int = 0
    rel_l2: float = 0.0
    max_abs: float = 0.0
    mismatched: int = 0

    def add(self, v: CallVerdict) -> None:
        self.calls += 1
        self.failed += v.fault
        self.errors += v.error is not None
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
    """Replayed calls (``calls``, in call order); what was not recorded (``skipped``: op, reason, calls) and the
    call sites with no recorded call at all (``unrecorded``: path, op)."""

    backend: str
    dtype: str
    calls: list[CallVerdict]
    skipped: list[dict[str, Any]] = field(default_factory=list)
    unrecorded: list[tuple[str, str]] = field(default_factory=list)
    recorded_bytes: int = 0
    rank: int = 0

    @property
    def rows(self) -> list[OpRow]:
        rows: dict[tuple[str, str, str], OpRow] = {}
        for v in self.calls:
            rows.setdefault((v.path, v.attr, v.op), OpRow(v.path, v.op)).add(v)
        return list(rows.values())

    @property
    def first_fault(self) -> CallVerdict | None:
        """The first op call (in the run's order) out of tolerance."""
        return next((v for v in self.calls if v.fault), None)

    @property
    def errors(self) -> list[CallVerdict]:
        """Calls the replay itself could not run (not a verdict on the backend)."""
        return [v for v in self.calls if v.error is not None]

    def status(self, stream_first_bad: str | None = None) -> str:
        if self.first_fault is not None:
            return "fault"
        if self.unrecorded or self.errors:
            return "inconclusive"
        return "drift" if stream_first_bad is not None else "ok"

    @property
    def passed(self) -> bool:
        """No op call at fault and every call site judged."""
        return self.status() == "ok"

    def verdict(self, stream_first_bad: str | None = None) -> str:
        """One sentence: the op at fault, what could not be judged, drift, or agreement."""
        status, f, n = self.status(stream_first_bad), self.first_fault, len(self.calls)
        if status == "fault":
            where = f"layer {f.layer} ({f.path})" if f.layer is not None else f.path
            return f"op at fault: {f.op} in {where}, call #{f.index} of the run: {f.problems[0]}"
        if status == "inconclusive":
            parts = []
            if self.unrecorded:
                parts.append(
                    f"{len(self.unrecorded)} call sites never recorded (store cap; raise --per-op-max-mb "
                    f"or lower --per-op-samples), e.g. {self.unrecorded[0][1]} at {self.unrecorded[0][0]}"
                )
            if self.errors:
                parts.append(
                    f"{len(self.errors)} calls could not be replayed, e.g. {self.errors[0].op}: {self.errors[0].error}"
                )
            return f"inconclusive: no replayed op call is out of bounds, but {'; '.join(parts)}"
        if status == "drift":
            return (
                f"accumulated rounding, no op at fault: all {n} replayed op calls are within their "
                f"conformance bounds while the residual stream drifts from {stream_first_bad}"
            )
        return f"no op at fault: all {n} replayed op calls are within their conformance bounds"

    def as_dict(self, stream_first_bad: str | None = None) -> dict[str, Any]:
        """The report as strict JSON types (non-finite numbers as strings)."""
        f = self.first_fault
        return finite(
            {
                "backend": self.backend,
                "dtype": self.dtype,
                "rank": self.rank,
                "status": self.status(stream_first_bad),
                "passed": self.passed,
                "verdict": self.verdict(stream_first_bad),
                "first_fault": None
                if f is None
                else {
                    "index": f.index,
                    "layer": f.layer,
                    "module": f.module,
                    "op": f.op,
                    "path": f.path,
                    "problems": f.problems,
                },
                "rows": [
                    {
                        "layer": r.layer,
                        "module": r.module,
                        "op": r.op,
                        "calls": r.calls,
                        "failed": r.failed,
                        "errors": r.errors,
                        "rel_l2_of_bound": r.rel_l2,
                        "max_abs_of_bound": r.max_abs,
                        "mismatched": r.mismatched,
                    }
                    for r in self.rows
                ],
                "calls": [
                    {
                        "index": v.index,
                        "layer": v.layer,
                        "module": v.module,
                        "op": v.op,
                        "ok": v.ok,
                        "error": v.error,
                        "static": v.static,
                        "shapes": v.shapes,
                        "outputs": v.outputs,
                        "problems": v.problems,
                    }
                    for v in self.calls
                ],
                "skipped": self.skipped,
                "unrecorded": [{"path": p, "op": o} for p, o in self.unrecorded],
                "recorded_bytes": self.recorded_bytes,
            }
        )
