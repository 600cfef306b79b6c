"""Replaying recorded op calls on the reference in float64, judged as ``hetero conformance`` judges.

Each call runs three ways on the host: the recorded outputs (the backend's), the reference on
float64 copies of the recorded inputs (the oracle), and the reference on the inputs as they
were (its own error in the run's dtype). The verdict is conformance's: the same oracle
(``run_oracle``: fp8 / int8 GEMMs on dequantized operands), the same comparison per output
kind (``row_set`` outputs as sets), the same tolerance row for the op's dtype, and an output of
another shape or dtype than the reference's is wrong. A call the tool itself cannot replay is
an ``error``, never a fault of the backend.
"""

from __future__ import annotations

import math
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch

from hetero.tools.replay._store import TensorStore
from hetero.tools.replay.recorder import CallRecord, Located
from hetero.verify.calls import call
from hetero.verify.case import dtype_name
from hetero.verify.judge import judge
from hetero.verify.oracles import clone_inputs, run_oracle
from hetero.verify.outputs import comparable, kind_of, outputs_of
from hetero.verify.tolerances import tolerance

__all__ = ["CallVerdict", "Replayer", "finite"]


@dataclass
class CallVerdict(Located):
    """One replayed call: per output its metrics and bounds (conformance's report fields), what is wrong
    (``problems``), or why it could not be replayed (``error``)."""

    index: int
    path: str
    attr: str
    op: str
    static: dict[str, str]
    shapes: dict[str, list[int]] = field(default_factory=dict)
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Judged and within every bound (a call that could not be replayed is not ok, and not a fault)."""
        return self.error is None and not self.problems

    @property
    def fault(self) -> bool:
        return self.error is None and bool(self.problems)


class Replayer:
    """Replays ``CallRecord``s from ``store``; ``dtype`` is the run's compute dtype (the tolerance row)."""

    def __init__(self, store: TensorStore, dtype: torch.dtype):
        import hetero

        self.store, self.dtype = store, dtype
        self.reference = hetero.load("cpu_ref", device="cpu", validate=True)

    def replay(self, record: CallRecord) -> CallVerdict:
        verdict = CallVerdict(record.index, record.path, record.attr, record.op, dict(record.static))
        try:
            tensors = record.tensors(self.store)
            expected = self._expected(record, record.arguments(tensors))
        except Exception as e:
            verdict.error = traceback.format_exception_only(type(e), e)[-1].strip()
            return verdict
        self._judge(record, tensors, expected, verdict)
        return verdict

    def _expected(self, record: CallRecord, inputs: dict[str, Any]):
        op = record.op
        raw, oracle_in = run_oracle(self.reference, op, clone_inputs(inputs), lambda fn, i: call(fn, op, i))
        ref_in = clone_inputs(inputs)
        ref = outputs_of(op, ref_in, call(getattr(self.reference, op), op, ref_in))
        return comparable(op, outputs_of(op, oracle_in, raw)), comparable(op, ref), bool(inputs.get("act_quant"))

    def _judge(self, record: CallRecord, tensors: dict[str, torch.Tensor], expected, verdict: CallVerdict) -> None:
        oracle, ref, quantized = expected
        got = comparable(record.op, {k: tensors[f"out.{k}"] for k in record.outputs})
        verdict.shapes = {k: list(t.shape) for k, t in got.items()}
        for name, want in oracle.items():
            g, r = got.get(name), ref.get(name)
            if g is None or tuple(g.shape) != tuple(want.shape) or (r is not None and g.dtype != r.dtype):
                what = None if g is None else f"{dtype_name(g.dtype)}{list(g.shape)}"
                verdict.problems.append(
                    f"'{name}': the backend gave {what}, the reference "
                    f"{dtype_name(r.dtype) if r is not None else ''}{list(want.shape)}"
                )
                continue
            tol = tolerance(
                dtype_name(self.dtype), dtype_name(r.dtype) if r is not None else None, quantized_activations=quantized
            )
            judge(name, g, want, r, kind_of(record.op, name, want), tol, verdict.outputs, verdict.problems)

    def replay_all(self, records: list[CallRecord]) -> list[CallVerdict]:
        return [self.replay(r) for r in records]


def finite(value: Any) -> Any:
    """``value`` with every non-finite float as a string ("nan", "inf", "-inf"), for strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value
