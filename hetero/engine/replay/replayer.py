"""Replaying recorded op calls on the reference in float64, judged as ``hetero conformance`` judges.

Each call runs three ways on the host: the recorded outputs (the backend's), the reference on
float64 copies of the recorded inputs (the oracle), and the reference on the inputs as they
were (its own error in the run's dtype). The verdict is conformance's: the same oracle
(``run_oracle``: fp8 / int8 GEMMs on dequantized operands), the same comparison per output
kind (``row_set`` outputs as sets) and the same tolerance row for the op's dtype.
"""
from __future__ import annotations

import math
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch

from hetero.engine.replay.recorder import CallRecord
from hetero.engine.replay._store import TensorStore

__all__ = ["CallVerdict", "Replayer"]


@dataclass
class CallVerdict:
    """One replayed call: per output its metrics and bounds (conformance's report fields), what is wrong."""

    index: int
    path: str
    op: str
    layer: int | None
    module: str
    static: dict[str, str]
    shapes: dict[str, list[int]] = field(default_factory=dict)
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def fraction(self) -> float:
        """The worst output's error as a fraction of its bound (rel L2 or max abs; inf for an exact mismatch)."""
        return max([_fraction(m) for m in self.outputs.values()] or [0.0 if self.ok else math.inf])


def _fraction(m: dict[str, Any]) -> float:
    if m.get("kind") != "float":
        return math.inf if m.get("mismatched") else 0.0
    parts = [m["rel_l2"] / m["bound_rel_l2"] if m["bound_rel_l2"] else (math.inf if m["rel_l2"] else 0.0),
             m["max_abs"] / m["bound_max_abs"] if m["bound_max_abs"] else (math.inf if m["max_abs"] else 0.0)]
    return max(0.0 if math.isnan(p) else p for p in parts) if not m.get("nonfinite_mismatch") else math.inf


class Replayer:
    """Replays ``CallRecord``s from ``store``; ``dtype`` is the run's compute dtype (the tolerance row)."""

    def __init__(self, store: TensorStore, dtype: torch.dtype):
        import hetero

        self.store, self.dtype = store, dtype
        self.reference = hetero.load("cpu_ref", device="cpu", validate=True)

    def replay(self, record: CallRecord) -> CallVerdict:
        verdict = CallVerdict(record.index, record.path, record.op, record.layer, record.module, dict(record.static))
        try:
            self._judge(record, verdict)
        except Exception as e:
            tb = traceback.format_exception_only(type(e), e)[-1].strip()
            verdict.problems.append(f"the replay failed: {tb}")
        return verdict

    def _judge(self, record: CallRecord, verdict: CallVerdict) -> None:
        from hetero_conformance.case import dtype_name
        from hetero_conformance.judge import judge
        from hetero_conformance.oracles import clone_inputs, run_oracle
        from hetero_conformance.outputs import comparable, kind_of, outputs_of
        from hetero_conformance.runner import call
        from hetero_conformance.tolerances import tolerance

        tensors = self.store.get(record.index)
        inputs = record.arguments(tensors)
        op = record.op
        got = comparable(op, {k: tensors[f"out.{k}"] for k in record.outputs})
        verdict.shapes = {k: list(t.shape) for k, t in got.items()}
        raw, oracle_in = run_oracle(self.reference, op, clone_inputs(inputs), lambda fn, i: call(fn, op, i))
        oracle = comparable(op, outputs_of(op, oracle_in, raw))
        ref_in = clone_inputs(inputs)
        ref = comparable(op, outputs_of(op, ref_in, call(getattr(self.reference, op), op, ref_in)))
        quantized = bool(inputs.get("act_quant"))
        for name, want in oracle.items():
            g = got.get(name)
            if g is None or tuple(g.shape) != tuple(want.shape):
                verdict.problems.append(f"'{name}': recorded {None if g is None else list(g.shape)}, the reference "
                                        f"gives {list(want.shape)}")
                continue
            out_dtype = dtype_name(ref[name].dtype) if name in ref else None
            tol = tolerance(dtype_name(self.dtype), out_dtype, quantized_activations=quantized)
            judge(name, g, want, ref.get(name), kind_of(op, name, want), tol, verdict.outputs, verdict.problems)

    def replay_all(self, records: list[CallRecord]) -> list[CallVerdict]:
        return [self.replay(r) for r in records]
