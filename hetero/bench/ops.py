"""The op benchmark: each performance case on one backend, timed, modelled, and set against the reference.

For each case the inputs are drawn on the CPU from the case's seed and moved to
the backend's device (metadata included, strides kept). The implementation is
the one an engine would get: ``ops.native(op, **case.static)`` tells a native op
from a fallback (the reference, for an op the backend lacks) and from a
declined one (``supports`` said no: the reference runs); fallback and declined
ops are timed and marked. The reference (cpu_ref) runs the same inputs on the
same device in the same process, for the ``x ref`` column.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from hetero.bench._timer import TimerConfig, Timing, measure, steady_heap
from hetero.bench.baseline import Metric
from hetero.bench.devices import Ceilings, roofline
from hetero.bench.model import Work, work
from hetero.ops import Ops
from hetero.spec import OPS

__all__ = ["BenchConfig", "OpResult", "OpBench", "NATIVE", "FALLBACK", "DECLINED", "SKIPPED", "ERROR"]

NATIVE, FALLBACK, DECLINED, SKIPPED, ERROR = "native", "fallback", "declined", "skipped", "error"


@dataclass(frozen=True)
class BenchConfig:
    """How to time: the timer's budgets, whether to time the reference too, the input seed."""

    timer: TimerConfig = field(default_factory=TimerConfig)
    reference: bool = True
    seed: int = 0


@dataclass(frozen=True)
class OpResult:
    """One case's measurement: the timing, its byte/flop model, the reference's timing and the roofline."""

    case_id: str
    op: str
    shape: str
    dtype: str
    status: str  # native | fallback | declined | skipped | error
    note: str = ""
    timing: Timing | None = None
    work: Work | None = None
    reference: Timing | None = None
    reference_note: str = ""
    roofline: float | None = None
    roofline_note: str = ""

    @property
    def seconds(self) -> float | None:
        return None if self.timing is None else self.timing.median

    @property
    def gb_s(self) -> float | None:
        return None if self.work is None or not self.seconds else self.work.bytes / self.seconds / 1e9

    @property
    def tflops(self) -> float | None:
        """Achieved TFLOP/s; None for pure data movement (0 flops in the model)."""
        return (
            None
            if self.work is None or not self.work.flops or not self.seconds
            else self.work.flops / self.seconds / 1e12
        )

    @property
    def speedup(self) -> float | None:
        """Reference time / this time: 3.0 means three times faster than the reference."""
        return None if self.reference is None or not self.seconds else self.reference.median / self.seconds

    def metric(self) -> Metric:
        """The baseline metric of this case: the fastest call's seconds, named by the case id.

        On a shared machine noise only ever adds time, so the minimum of many calls
        is the statistic that repeats from run to run (the median shown in the table
        moved by 20-80% between idle runs on the 2-core CI machine; the minimum of
        compute-bound ops by under 10%)."""
        assert self.timing is not None, f"{self.case_id} was not timed"
        return Metric(self.case_id, self.timing.min, "s", False, self.timing.samples)

    def as_dict(self) -> dict[str, Any]:
        t, r = self.timing, self.reference
        return {
            "id": self.case_id,
            "op": self.op,
            "shape": self.shape,
            "dtype": self.dtype,
            "status": self.status,
            "note": self.note,
            "seconds": self.seconds,
            "min_s": t.min if t else None,
            "max_s": t.max if t else None,
            "samples": len(t.samples) if t else 0,
            "timer": t.method if t else None,
            "flops": self.work.flops if self.work else None,
            "bytes": self.work.bytes if self.work else None,
            "gb_s": self.gb_s,
            "tflops": self.tflops,
            "reference_s": r.median if r else None,
            "speedup_vs_reference": self.speedup,
            "reference_note": self.reference_note,
            "roofline_fraction": self.roofline,
            "roofline_note": self.roofline_note,
        }


def _caller(fn: Callable, op: str, inputs: dict[str, Any]) -> Callable[[], object]:
    bound = OPS[op].signature.bind(**inputs)
    args, kwargs = bound.args, bound.kwargs
    return lambda: fn(*args, **kwargs)


class OpBench:
    """Times performance cases on ``ops`` (one backend on one device).

    On a CPU it fixes glibc's malloc thresholds for the rest of the process
    (``steady_heap``), so an op's timing does not depend on what ran before it."""

    def __init__(self, ops: Ops, config: BenchConfig, ceilings: Ceilings | None, ceilings_note: str = ""):
        self.ops, self.config = ops, config
        self.ceilings, self.ceilings_note = ceilings, ceilings_note
        if ops.device.type == "cpu":
            steady_heap()

    def implementation(self, case: Any) -> tuple[Callable | None, str, str]:
        """(callable, status, note) as an engine would resolve this case's static configuration."""
        binding, reason = self.ops.native(case.op, **case.static)
        if binding is None:
            return getattr(self.ops, case.op), FALLBACK, f"{reason}: the reference was timed"
        if reason is not None:
            ref = self.ops.reference
            note = f"supports() declined: {reason}"
            return (getattr(ref, case.op) if ref is not None else None), DECLINED, note
        return binding.fn, NATIVE, ""

    def inputs(self, case: Any) -> dict[str, Any]:
        """The case's inputs on the backend's device."""
        from hetero.verify.oracles import to_device

        return to_device(case.inputs(self.config.seed), self.ops.device)

    def time_case(self, case: Any) -> Timing:
        """One more timing of ``case`` (fresh inputs from the same seed): the re-measurement of a regression."""
        fn, _, _ = self.implementation(case)
        assert fn is not None, f"{case.id} has no implementation to time"
        return measure(_caller(fn, case.op, self.inputs(case)), self.ops.device, self.config.timer)

    def run(self, case: Any) -> OpResult:
        """Time ``case`` and compute its metrics; an op that raises is an ``error`` result, not a crash."""
        head = dict(case_id=case.id, op=case.op, shape=case.shape, dtype=case.dtype)
        fn, status, note = self.implementation(case)
        if fn is None:
            return OpResult(**head, status=ERROR, note=f"{note}, and no reference is installed")
        inputs = self.inputs(case)
        try:
            call = _caller(fn, case.op, inputs)
            call()
            timing = measure(call, self.ops.device, self.config.timer)
        except Exception as e:  # a kernel that fails is reported, the run goes on
            return OpResult(**head, status=ERROR, note=f"{type(e).__name__}: {e}")
        w = work(case.op, inputs)
        ref, ref_note = self._reference(case, inputs, status)
        frac, frac_note = roofline(w, timing.median, case.dtype, self.ceilings)
        return OpResult(
            **head,
            status=status,
            note=note,
            timing=timing,
            work=w,
            reference=ref,
            reference_note=ref_note,
            roofline=frac,
            roofline_note=self.ceilings_note or frac_note,
        )

    def _reference(self, case: Any, inputs: dict[str, Any], status: str) -> tuple[Timing | None, str]:
        ref = self.ops.reference
        if not self.config.reference:
            return None, "--no-reference"
        if ref is None:
            return None, "the backend is the reference" if self.ops.name == "cpu_ref" else "cpu_ref is not installed"
        if status != NATIVE:
            return None, "the reference itself was timed"
        try:
            return measure(_caller(getattr(ref, case.op), case.op, inputs), self.ops.device, self.config.timer), ""
        except Exception as e:  # e.g. the reference cannot run on this device
            return None, f"the reference raised {type(e).__name__}: {e}"

    @staticmethod
    def skipped(op: str, reason: str) -> OpResult:
        """The result row of an op that has no performance case."""
        return OpResult(case_id=f"{op}/-/-", op=op, shape="-", dtype="-", status=SKIPPED, note=reason)
