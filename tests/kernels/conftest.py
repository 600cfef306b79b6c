"""Kernel tests run the Triton kernels through Triton's interpreter on CPU tensors.

Triton decides interpreted-or-compiled for its own helpers (tl.sum, tl.max, ...)
when it is first imported, so TRITON_INTERPRET is set here, at collection, before
anything imports it. hetero's own flag is set per test (monkeypatch restores it),
so backend selection elsewhere in the session never sees it.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

if importlib.util.find_spec("triton") is None:  # the kernels need triton; hetero-cuda installs it
    collect_ignore_glob = ["test_*.py"]
os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(autouse=True)
def triton_interpreter(monkeypatch):
    monkeypatch.setenv("HETERO_TRITON_INTERPRET", "1")


@pytest.fixture
def triton_backend():
    """The portable TritonBackend under the interpreter (CPU tensors)."""
    from hetero.kernels import TritonBackend

    return TritonBackend()


@pytest.fixture
def validated_ops(triton_backend):
    """The TritonBackend's op table with index validation on (hetero.spec.validate in front)."""
    from hetero.ops import Ops

    triton_backend.validate = True
    return Ops(triton_backend, None, {})
