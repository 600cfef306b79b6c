"""The verifier: how one op's result is checked against the float64 reference.

What a check is made of, shared by the conformance suite (``hetero_conformance``),
``hetero check-model --per-op`` (``hetero.tools.replay``) and ``hetero bench``:

* :mod:`~hetero.verify.case`: a case (one op, one named shape, one dtype, inputs drawn
  from a seed) and dtype naming; :mod:`~hetero.verify.inputs` draws the inputs and
  :mod:`~hetero.verify.shapes` holds the real model configurations they are sized from;
* :mod:`~hetero.verify.calls`: calling an implementation with a case's arguments;
* :mod:`~hetero.verify.oracles`: the reference backend on float64 copies (the oracle);
* :mod:`~hetero.verify.outputs`: what each op produces and how each output is compared;
* :mod:`~hetero.verify.metrics`, :mod:`~hetero.verify.tolerances`, :mod:`~hetero.verify.judge`:
  the error metrics, the bounds and the one verdict rule.
"""

from __future__ import annotations

from hetero.verify.calls import call
from hetero.verify.case import DTYPES, Case, dtype_name
from hetero.verify.judge import judge
from hetero.verify.metrics import Metrics, compare
from hetero.verify.oracles import clone_inputs, run_oracle, to_device, to_float64
from hetero.verify.outputs import OutputMismatch, comparable, kind_of, outputs_of, untouched_inputs
from hetero.verify.tolerances import EXACT, Tolerance, tolerance

__all__ = [
    "Case",
    "DTYPES",
    "dtype_name",
    "call",
    "clone_inputs",
    "run_oracle",
    "to_device",
    "to_float64",
    "OutputMismatch",
    "comparable",
    "kind_of",
    "outputs_of",
    "untouched_inputs",
    "Metrics",
    "compare",
    "judge",
    "Tolerance",
    "tolerance",
    "EXACT",
]
