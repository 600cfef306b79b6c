"""hetero-ascend binds its torch_npu ops the one way (``bind_from`` over family modules): each mapped op is a
function of a hetero_ascend family module, under the spec's signature, named by explain where it is defined."""

from __future__ import annotations

import pytest

pytest.importorskip("hetero_ascend.plugin", reason="hetero-ascend is not installed (pip install -e backends/ascend)")
import hetero  # noqa: E402
from hetero.kernels import TritonBackend  # noqa: E402
from hetero.spec import OPS  # noqa: E402
from hetero_ascend import attention, common, gemm, layers, moe, support  # noqa: E402
from hetero_ascend.plugin import AscendBackend  # noqa: E402

FAMILIES = (attention, gemm, layers, moe)


def test_every_mapped_op_is_a_family_function_with_the_spec_signature():
    backend = AscendBackend("meta")
    bound = {op: family for family in FAMILIES for op in family.__all__ if op in OPS}
    assert set(bound) == set(support.MAPPED)
    for op, family in bound.items():
        fn = getattr(backend, op)
        assert f"{fn.__module__}.{fn.__qualname__}" == f"{family.__name__}.{op}", op
        assert OPS[op].check_signature(fn) is None, op
        assert getattr(AscendBackend, op).__doc__ == getattr(family, op).__doc__, op


def test_explain_names_the_family_functions():
    ops, _ = hetero.Registry().inspect("ascend")
    info = ops.explain()
    assert info["route"].implementation == "hetero_ascend.moe.route"
    assert info["mla_attention"].implementation == "hetero_ascend.attention.mla_attention"
    assert info["gemm"].implementation == "hetero.kernels.backend.TritonBackend.gemm"


def test_a_with_triton_op_falls_back_to_the_triton_op_of_its_backend_at_the_call(monkeypatch):
    backend = AscendBackend("cpu")
    calls = []
    monkeypatch.setattr(TritonBackend, "rms_norm", lambda self, *a, **k: calls.append(self) or "triton")
    assert backend.rms_norm("x", "w", 1e-6, weight_offset=1.0) == "triton" and calls == [backend]
    monkeypatch.setattr(common, "torch_npu", lambda: None)  # the npu path is never taken for this call
    assert layers.rms_norm(backend, "x", "w", 1e-6, gate="g") == "triton" and calls == [backend, backend]
