"""What hetero-conformance adds to the ``hetero`` command (entry point group ``hetero.commands``).

``add_parsers`` adds ``hetero conformance``; ``backend_files`` adds the conformance test to the
package ``hetero new-backend`` writes (``tests/test_conformance.py``: the quick tier in CI).
"""

from __future__ import annotations

from string import Template
from typing import Any

__all__ = ["add_parsers", "backend_files"]

_TEST = '''\
"""Conformance of the $name backend against hetero's float64 reference: run it in CI (`pytest tests`).

The quick tier of hetero-conformance's case catalog runs against the installed
backend; ops it does not implement are `fallback` (not executed). Any failing
case fails the test with its id (op/shape/dtype) and what is wrong.
HETERO_CONFORMANCE_TIER=full runs the full catalog; HETERO_CONFORMANCE_OPS=a,b limits the ops.
"""
from __future__ import annotations

import os

import hetero
from hetero_conformance.runner import FAILING
from hetero_conformance.suite import Selection, run_suite

BACKEND = "$name"


def test_backend_loads():
    ops = hetero.load(BACKEND)
    assert ops.name == BACKEND


def test_conformance():
    ops = tuple(o.strip() for o in os.environ.get("HETERO_CONFORMANCE_OPS", "").split(",") if o.strip())
    selection = Selection(quick=os.environ.get("HETERO_CONFORMANCE_TIER", "quick") != "full", ops=ops)
    suite = run_suite(hetero.default_registry(), BACKEND, selection)
    print({status: n for status, n in suite.counts().items() if n})
    failing = [r for r in suite.results if r.status in FAILING]
    assert not failing, "\\n".join(f"{r.id}: {r.status}: {r.message}" for r in failing)
'''


def add_parsers(subparsers: Any) -> None:
    """Add ``hetero conformance`` to the ``hetero`` command's subparsers."""
    from hetero_conformance.cli import add_parser

    add_parser(subparsers)


def backend_files(values: dict[str, str]) -> dict[str, str]:
    """The conformance test of a new backend package (``values``: its ``name`` among others)."""
    return {"tests/test_conformance.py": Template(_TEST).substitute(values)}
