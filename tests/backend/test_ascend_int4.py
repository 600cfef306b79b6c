"""hetero-ascend and packed int4 weights (spec 1.9, W4A16): declined with the documented reason, and a direct
packed grouped_gemm call handed to the portable Triton kernel before any torch_npu call. No NPU runs this."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("hetero_ascend.plugin", reason="hetero-ascend is not installed (pip install -e backends/ascend)")
from hetero_ascend import common, plugin  # noqa: E402
from hetero_ascend.plugin import AscendBackend  # noqa: E402

#: the static configurations of the W4A16 conformance cases (cases/int4.py, cases/int4_moe.py)
W4A16 = {
    "gemm": {"dtype": "bfloat16", "weight_dtype": "int4", "group_size": 128, "b_zero_point": False},
    "grouped_gemm": {"dtype": "bfloat16", "weight_dtype": "int4", "group_size": 32, "num_experts": 8},
    "fused_moe": {"dtype": "float16", "weight_dtype": "int4", "group_size": 128, "w13_zero_point": True},
}


@pytest.mark.parametrize("op", sorted(W4A16))
def test_w4a16_is_declined_with_the_documented_reason(op):
    backend = AscendBackend("meta")
    why = backend.supports(op, **W4A16[op])
    assert "npu_weight_quant_batchmatmul" in why and "bit-exact" in why and "never run on an NPU" in why
    float_static = {k: v for k, v in W4A16[op].items() if k not in ("weight_dtype", "group_size")}
    assert "int4" not in (backend.supports(op, **{**float_static, "w13_zero_point": False}) or "")


def test_a_packed_grouped_gemm_call_goes_to_the_triton_kernel(monkeypatch):
    monkeypatch.setattr(common, "torch_npu", lambda: None)  # no torch_npu call may happen
    calls = []
    monkeypatch.setattr(plugin.TritonBackend, "grouped_gemm", lambda self, *a, **k: calls.append(k) or "triton")
    a, ends = torch.randn(5, 9, dtype=torch.bfloat16), torch.tensor([2, 5], dtype=torch.int32)
    b, s = torch.randint(0, 256, (2, 4, 5), dtype=torch.uint8), torch.rand(2, 4, 1)
    assert AscendBackend("cpu").grouped_gemm(a, b, ends, b_scale=s, group_size=16) == "triton"
    assert calls[0]["group_size"] == 16 and calls[0]["b_scale"] is s and calls[0]["b_zero_point"] is None
