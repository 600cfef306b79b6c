"""Runs conformance cases against one backend: oracle, reference in the test dtype, backend, verdict."""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import Any, MutableMapping

import torch

from hetero.backend import Backend
from hetero.ops import Ops
from hetero.verify.calls import call
from hetero.verify.case import Case, dtype_name
from hetero.verify.judge import judge
from hetero.verify.oracles import clone_inputs, run_oracle, to_device
from hetero.verify.outputs import OutputMismatch, comparable, kind_of, outputs_of, spec_of, untouched_inputs
from hetero.verify.plan import with_plan
from hetero.verify.tolerances import tolerance

__all__ = ["CaseResult", "Expected", "Runner", "STATUSES", "FAILING"]

STATUSES = ("pass", "fail", "error", "skipped", "fallback", "crashed", "timeout")
FAILING = ("fail", "error", "crashed", "timeout")


@dataclass
class CaseResult:
    """The verdict on one case, with the metrics of every output against its bound."""

    id: str
    op: str
    family: str
    shape: str
    dtype: str
    status: str
    message: str = ""
    seed: int = 0
    seconds: float = 0.0
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    tolerance: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, case: Case, status: str, message: str = "", **kw: Any) -> "CaseResult":
        return cls(case.id, case.op, case.family, case.shape, case.dtype, status, message, **kw)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Expected:
    """A case's inputs (CPU, case dtype), the oracle's outputs and the reference's, in the test dtype."""

    inputs: dict[str, Any]
    oracle: dict[str, torch.Tensor]
    reference: dict[str, torch.Tensor]
    layout: dict[str, tuple[tuple[int, ...], torch.dtype]]  # each output's shape and dtype, as the reference returns it


class Runner:
    """Checks ``ops`` (one backend on one device) case by case.

    ``cache`` (any mapping, shared between runners) keeps each case's inputs and
    expected outputs so several backends can be checked against one oracle run.
    """

    def __init__(
        self,
        ops: Ops,
        reference: Backend,
        *,
        seed: int = 0,
        cache: MutableMapping[tuple[str, int], Expected] | None = None,
    ):
        self.ops, self.reference, self.seed = ops, reference, seed
        self.cache = cache if cache is not None else {}

    def expected(self, case: Case) -> Expected:
        key = (case.id, self.seed)
        if key not in self.cache:
            inputs = case.inputs(self.seed)
            raw, oracle_in = run_oracle(
                self.reference, case.op, clone_inputs(inputs), lambda fn, i: call(fn, case.op, i)
            )
            oracle = outputs_of(case.op, oracle_in, raw)
            ref_in = clone_inputs(inputs)
            ref = outputs_of(case.op, ref_in, call(getattr(self.reference, case.op), case.op, ref_in))
            layout = {k: (tuple(v.shape), v.dtype) for k, v in ref.items()}
            self.cache[key] = Expected(inputs, comparable(case.op, oracle), comparable(case.op, ref), layout)
        return self.cache[key]

    def run(self, case: Case) -> CaseResult:
        start = time.perf_counter()
        result = self._run(case)
        result.seed, result.seconds = case.seed(self.seed), time.perf_counter() - start
        return result

    def _run(self, case: Case) -> CaseResult:
        binding, reason = self.ops.native(case.op, **case.static)
        if binding is None:
            return CaseResult.of(case, "fallback", f"{reason}: the reference ran, nothing of the backend was tested")
        if reason is not None:
            return CaseResult.of(case, "skipped", f"supports() declined: {reason}")
        try:
            exp = self.expected(case)
        except Exception as e:
            return CaseResult.of(
                case, "error", f"the reference failed on this case (a catalog bug): {type(e).__name__}: {e}"
            )
        inputs = to_device(exp.inputs, self.ops.device)
        poisoned = self._poison_out(case, inputs, exp)
        untouched = untouched_inputs(case.op, inputs)
        try:
            raw = call(binding.fn, case.op, inputs)
            if self.ops.device.type != "cpu" and hasattr(torch, "accelerator"):
                torch.accelerator.synchronize()
        except Exception as e:
            tb = traceback.format_exception_only(type(e), e)[-1].strip()
            return CaseResult.of(case, "error", f"{binding.origin} raised {tb}")
        try:
            outputs = outputs_of(case.op, inputs, raw)
        except OutputMismatch as e:
            return CaseResult.of(case, "fail", str(e))
        problems = self._structure(outputs, exp, poisoned)
        problems += [f"modified its input '{k}'" for k, v in untouched.items() if not _same(inputs[k], v)]
        problems += self._planned(case, binding.fn, binding.origin, exp)
        if case.check is not None and (why := case.check(exp.inputs, outputs)):
            problems.append(why)  # a statistical case's own property of the outputs
        return self._verdict(case, comparable(case.op, outputs), exp, problems)

    def _planned(self, case: Case, fn: Any, origin: str, exp: Expected) -> list[str]:
        """The same call again on fresh inputs, with the step plan the backend's hook makes of its
        metadata (spec 1.6), judged as the first; nothing when the backend does not plan this op."""
        try:
            inputs = with_plan(self.ops, case.op, to_device(exp.inputs, self.ops.device))
        except Exception as e:
            return [f"with the step plan: planning raised {traceback.format_exception_only(type(e), e)[-1].strip()}"]
        if inputs is None:
            return []
        poisoned = self._poison_out(case, inputs, exp)
        try:
            outputs = outputs_of(case.op, inputs, call(fn, case.op, inputs))
        except Exception as e:
            return [f"with the step plan: {origin} raised {traceback.format_exception_only(type(e), e)[-1].strip()}"]
        problems = self._structure(outputs, exp, poisoned)
        self._judge(case, comparable(case.op, outputs), exp, problems, {})
        return [f"with the step plan: {p}" for p in problems]

    def _poison_out(self, case: Case, inputs: dict[str, Any], exp: Expected) -> dict[str, torch.Tensor]:
        """NaN buffers for the out= arguments the case leaves out (a mutated argument that is also a
        returned output): the op must write every element and return the buffer it was given."""
        spec, poisoned = spec_of(case.op), {}
        for name in sorted({o.name for o in spec.returns} & set(spec.mutated_names)):
            if name not in inputs and name in exp.layout:
                shape, dtype = exp.layout[name]
                inputs[name] = poisoned[name] = torch.full(shape, float("nan"), dtype=dtype, device=self.ops.device)
        return poisoned

    @staticmethod
    def _structure(outputs: dict[str, torch.Tensor], exp: Expected, poisoned: dict[str, torch.Tensor]) -> list[str]:
        problems = []
        if set(outputs) != set(exp.layout):
            problems.append(f"returned outputs {sorted(outputs)}, expected {sorted(exp.layout)}")
        for name, t in outputs.items():
            want = exp.layout.get(name)
            if want is not None and (tuple(t.shape) != want[0] or t.dtype != want[1]):
                problems.append(
                    f"'{name}' is {dtype_name(t.dtype)}{list(t.shape)}, expected {dtype_name(want[1])}{list(want[0])}"
                )
        for name, buffer in poisoned.items():
            if name in outputs and outputs[name].data_ptr() != buffer.data_ptr():
                problems.append(f"did not return the {name}= buffer it was given")
        return problems

    @staticmethod
    def _judge(
        case: Case, got: dict[str, torch.Tensor], exp: Expected, problems: list[str], report: dict[str, Any]
    ) -> None:
        quantized = bool(case.static.get("act_quant"))
        for name, want in exp.oracle.items():
            g = got.get(name)
            if g is None or tuple(g.shape) != tuple(want.shape):
                continue
            layout = exp.layout.get(name)
            tol = tolerance(case.dtype, dtype_name(layout[1]) if layout else None, quantized_activations=quantized)
            judge(name, g, want, exp.reference.get(name), kind_of(case.op, name, want), tol, report, problems)

    def _verdict(self, case: Case, got: dict[str, torch.Tensor], exp: Expected, problems: list[str]) -> CaseResult:
        report: dict[str, dict[str, Any]] = {}
        quantized = bool(case.static.get("act_quant"))
        self._judge(case, got, exp, problems, report)
        status = "fail" if problems else "pass"
        return CaseResult.of(
            case,
            status,
            "; ".join(problems),
            outputs=report,
            tolerance=tolerance(case.dtype, quantized_activations=quantized).as_dict(),
        )


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    a = a.detach().cpu()
    return (
        a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b) or ((a == b) | (a != a) & (b != b)).all())
    )
