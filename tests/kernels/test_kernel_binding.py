"""TritonBackend binds every op in one loop over KERNEL_OPS: the table matches the kernel modules'
``__all__``, and each bound op is the kernel with the instance's tuning under the spec's signature."""

from __future__ import annotations

import importlib

import pytest

pytest.importorskip("triton", reason="triton is not installed")
from hetero.kernels.backend import KERNEL_OPS, TritonBackend  # noqa: E402
from hetero.spec import OP_NAMES, OPS  # noqa: E402


def test_the_table_is_the_kernel_modules_spec_ops():
    for module, ops in KERNEL_OPS.items():
        listed = importlib.import_module(module).__all__
        assert set(ops) == {op for op in listed if op in OPS}, module
    assert sorted(op for ops in KERNEL_OPS.values() for op in ops) == sorted(OP_NAMES)
    assert set(TritonBackend.native_ops()) == set(OP_NAMES)


def test_a_bound_op_carries_the_tuning_the_spec_signature_and_its_name(monkeypatch):
    monkeypatch.setenv("HETERO_TRITON_INTERPRET", "1")
    backend = TritonBackend()
    for op in OP_NAMES:
        fn = getattr(backend, op)
        assert OPS[op].check_signature(fn) is None, op
        assert f"{fn.__module__}.{fn.__qualname__}" == f"hetero.kernels.backend.TritonBackend.{op}"
        assert fn.keywords == ({} if op in ("route", "ep_dispatch", "ep_combine") else {"tuning": backend.tune})
