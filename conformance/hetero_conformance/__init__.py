"""hetero-conformance: proves a backend computes the same functions as the float64 reference.

Imports are lazy: the pytest plugin entry point loads this package in every
pytest run of an environment, and must cost nothing there.
"""

from __future__ import annotations

from typing import Any

from hetero_conformance._version import __version__ as __version__

__all__ = ["Case", "CaseResult", "Runner", "catalog", "Malformed", "run_robustness"]

_LAZY = {
    "Case": "hetero.verify.case",
    "CaseResult": "hetero_conformance.runner",
    "Runner": "hetero_conformance.runner",
    "catalog": "hetero_conformance.cases",
    "Malformed": "hetero_conformance.cases.malformed",
    "run_robustness": "hetero_conformance.robustness",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hetero_conformance' has no attribute {name!r}")
