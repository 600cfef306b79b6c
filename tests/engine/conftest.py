"""Engine tests: tiny random checkpoints made by transformers, shared per session.

TRITON_INTERPRET is set at collection, before anything imports triton, so the
engine tests that run the cuda backend through Triton's interpreter can do so in
the same session (hetero's own HETERO_TRITON_INTERPRET is set per test).
"""

from __future__ import annotations

import os

import pytest

os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """arch -> directory of a tiny random checkpoint (sharded, with a char-level tokenizer), built on first use."""
    from hetero.tools import tiny

    built: dict[str, object] = {}

    def get(arch: str):
        if arch not in built:
            built[arch] = tiny.build(arch, tmp_path_factory.mktemp(arch), tokenizer=True)
        return built[arch]

    return get


@pytest.fixture
def triton_interpreter(monkeypatch):
    """Select the cuda backend's Triton kernels through the interpreter, on CPU tensors."""
    pytest.importorskip("triton")
    monkeypatch.setenv("HETERO_TRITON_INTERPRET", "1")
