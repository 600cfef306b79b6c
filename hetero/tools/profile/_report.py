"""What ``hetero profile`` measured, aggregated: per op, per layer kind and per phase, the host parts, the trace.

Achieved GB/s and TFLOP/s are the byte/flop model's figures (``hetero.bench.model``)
summed over a row's calls, divided by their summed time. The roofline fraction is
the time an ideal kernel needs (per call the larger of flops / peak TFLOP/s of its
dtype and bytes / bandwidth, the ceilings of ``hetero bench``) summed, over the time
measured. A row any of whose calls the model has no figure for, or with no device
ceilings, shows None ("-"), never a guess.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetero.bench.devices import Ceilings, roofline
from hetero.tools.profile._host import HOST_PARTS, StepTimes
from hetero.tools.profile._layers import LAYER_KINDS
from hetero.tools.profile._timer import OpCall

__all__ = ["Figures", "ProfileReport", "ALL", "PHASES"]

ALL = "all"
#: phases in report order ("-": calls made outside an engine step, profiling a bare module)
PHASES = ("prefill", "mixed", "decode", "empty", "-")


@dataclass
class Figures:
    """Calls, seconds and the modelled work of a set of op calls."""

    calls: int = 0
    seconds: float = 0.0
    flops: float = 0.0
    bytes: float = 0.0
    ideal_seconds: float = 0.0
    modelled: int = 0  # calls with a byte/flop figure
    bounded: int = 0  # calls with a roofline bound

    def add(self, call: OpCall, ideal: float | None) -> None:
        self.calls += 1
        self.seconds += call.seconds
        if call.work is not None:
            self.modelled += 1
            self.flops += call.work.flops
            self.bytes += call.work.bytes
        if ideal is not None:
            self.bounded += 1
            self.ideal_seconds += ideal

    @property
    def mean(self) -> float:
        return self.seconds / self.calls if self.calls else 0.0

    @property
    def gb_s(self) -> float | None:
        return self.bytes / self.seconds / 1e9 if self.modelled == self.calls and self.seconds > 0 else None

    @property
    def tflop_s(self) -> float | None:
        return self.flops / self.seconds / 1e12 if self.modelled == self.calls and self.seconds > 0 else None

    @property
    def roofline(self) -> float | None:
        return self.ideal_seconds / self.seconds if self.bounded == self.calls and self.seconds > 0 else None

    def as_dict(self, step_seconds: float) -> dict[str, Any]:
        modelled = self.modelled == self.calls
        return {
            "calls": self.calls,
            "total_s": self.seconds,
            "mean_s": self.mean,
            "pct_of_step": 100 * self.seconds / step_seconds if step_seconds > 0 else None,
            "bytes": self.bytes if modelled else None,
            "flops": self.flops if modelled else None,
            "gb_s": self.gb_s,
            "tflop_s": self.tflop_s,
            "roofline_fraction": self.roofline,
        }


def _ordered(keys: Any, order: tuple[str, ...]) -> list[str]:
    return sorted(keys, key=lambda k: (order.index(k) if k in order else len(order), k))


@dataclass
class ProfileReport:
    """One profiled run: every op call, every engine step, the device and its ceilings.

    ``ops()`` / ``layers()``: {op or layer kind: {"all" and each phase: Figures}}, ops by
    total time; ``host()``: {"all" and each phase: {part: seconds}}; ``as_dict()`` the
    JSON form; ``trace()`` a Chrome / Perfetto trace with one event per op call.
    """

    device: str
    calls: list[OpCall]
    steps: list[StepTimes]
    ceilings: Ceilings | None = None
    ceilings_note: str = ""
    timing: str = "perf_counter"
    no_model: dict[str, str] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)

    @property
    def step_seconds(self) -> float:
        """The wall time of the profiled steps (the op time when no engine step ran)."""
        return sum(s.seconds for s in self.steps) if self.steps else sum(c.seconds for c in self.calls)

    @property
    def phases(self) -> list[str]:
        return _ordered({c.phase for c in self.calls} | {s.phase for s in self.steps}, PHASES)

    def _ideal(self, call: OpCall) -> float | None:
        if call.work is None:
            return None
        bound, _ = roofline(call.work, 1.0, call.dtype, self.ceilings)  # at 1 s, the fraction is the ideal time
        return bound

    def _group(self, key: str) -> dict[str, dict[str, Figures]]:
        out: dict[str, dict[str, Figures]] = defaultdict(lambda: defaultdict(Figures))
        for call in self.calls:
            ideal = self._ideal(call)
            row = out[getattr(call, key)]
            row[ALL].add(call, ideal)
            row[call.phase].add(call, ideal)
        return {k: {p: row[p] for p in [ALL, *_ordered(set(row) - {ALL}, PHASES)]} for k, row in out.items()}

    def ops(self) -> dict[str, dict[str, Figures]]:
        rows = self._group("op")
        return dict(sorted(rows.items(), key=lambda kv: -kv[1][ALL].seconds))

    def layers(self) -> dict[str, dict[str, Figures]]:
        rows = self._group("layer")
        return {k: rows[k] for k in _ordered(rows, LAYER_KINDS)}

    def host(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for phase in [ALL, *_ordered({s.phase for s in self.steps}, PHASES)]:
            steps = [s for s in self.steps if phase in (ALL, s.phase)]
            out[phase] = {
                "steps": len(steps),
                "step": sum(s.seconds for s in steps),
                **{part: sum(s.parts[part] for s in steps) for part in HOST_PARTS},
            }
        return out

    def as_dict(self) -> dict[str, Any]:
        total = self.step_seconds
        ceilings = (
            None
            if self.ceilings is None
            else {
                "name": self.ceilings.name,
                "tflops": dict(self.ceilings.tflops),
                "tb_s": self.ceilings.tb_s,
                "source": self.ceilings.source,
            }
        )
        return {
            "device": self.device,
            "timing": self.timing,
            "ceilings": ceilings,
            "ceilings_note": self.ceilings_note,
            "run": self.run,
            "step_seconds": total,
            "total_calls": len(self.calls),
            "ops": {op: {p: f.as_dict(total) for p, f in row.items()} for op, row in self.ops().items()},
            "layers": {k: {p: f.as_dict(total) for p, f in row.items()} for k, row in self.layers().items()},
            "host": self.host(),
            "no_byte_model": dict(self.no_model),
            "steps": [
                {"index": s.index, "phase": s.phase, "tokens": s.tokens, "seconds": s.seconds, "parts": dict(s.parts)}
                for s in self.steps
            ],
        }

    def trace(self) -> dict[str, Any]:
        """Chrome trace-event JSON: one complete ("X") event per op call, named as the op table names it."""
        names = (("process_name", f"hetero profile ({self.device})"), ("thread_name", f"ops ({self.timing})"))
        meta = [{"name": key, "ph": "M", "pid": 0, "tid": 0, "args": {"name": name}} for key, name in names]
        events = [
            {
                "name": c.op,
                "cat": "op",
                "ph": "X",
                "ts": c.start * 1e6,
                "dur": c.seconds * 1e6,
                "pid": 0,
                "tid": 0,
                "args": {"path": c.path, "layer": c.layer, "phase": c.phase, "step": c.step},
            }
            for c in self.calls
        ]
        return {"traceEvents": meta + events, "displayTimeUnit": "ms"}

    def write_trace(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.trace()))
