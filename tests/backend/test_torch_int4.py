"""The torch backend's packed int4 weights (spec 1.9, W4A16) against the reference: the dequantization bit
for bit, fused_moe dequantizing only the experts with tokens, and no graph break under torch.compile.
(The conformance tiers in test_torch_backend run the int4 cases and malformed calls.)"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("hetero_torch")
from hetero_cpu_ref import gemm as ref_gemm  # noqa: E402
from hetero_cpu_ref import moe as ref_moe  # noqa: E402
from hetero_cpu_ref._int4 import dequantize_int4  # noqa: E402
from hetero_torch import _int4  # noqa: E402
from hetero_torch import gemm as torch_gemm  # noqa: E402
from hetero_torch import moe as torch_moe  # noqa: E402

GEN = torch.Generator().manual_seed(35)
E, H, INTER, G, M, TOP = 6, 45, 13, 16, 5, 2


def _packed(*shape: int) -> torch.Tensor:
    return torch.randint(0, 256, shape, generator=GEN, dtype=torch.uint8)


def _scales(*shape: int) -> torch.Tensor:
    return torch.rand(shape, generator=GEN) * 0.1 + 1e-3


def _experts(zp: bool) -> dict:
    s13, s2 = _scales(E, 2 * INTER, -(-H // G)), _scales(E, H, -(-INTER // G))
    zps = lambda s: torch.randint(0, 16, s.shape, generator=GEN, dtype=torch.uint8) if zp else None  # noqa: E731
    return dict(
        w13=_packed(E, 2 * INTER, (H + 1) // 2),
        w2=_packed(E, H, (INTER + 1) // 2),
        w13_scale=s13,
        w2_scale=s2,
        w13_zero_point=zps(s13),
        w2_zero_point=zps(s2),
        group_size=G,
    )


@pytest.mark.parametrize("k, g, zp", [(45, 16, True), (64, 32, False), (7, 128, True)])
def test_dequantization_equals_the_reference_bit_for_bit(k, g, zp):
    b, s = _packed(3, 8, (k + 1) // 2), _scales(3, 8, -(-k // g))
    z = torch.randint(0, 16, s.shape, generator=GEN, dtype=torch.uint8) if zp else None
    assert torch.equal(_int4.dequantize(b, s, z, g, k), dequantize_int4(b, s, z, g, k))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemm_and_grouped_gemm_match_the_reference(dtype):
    k, n = 45, 24
    b, s = _packed(4, n, (k + 1) // 2), _scales(4, n, 3)
    z = torch.randint(0, 16, s.shape, generator=GEN, dtype=torch.uint8)
    a, bias = torch.randn(9, k, generator=GEN, dtype=dtype), torch.randn(n, generator=GEN)
    opts = dict(b_scale=s[0], b_zero_point=z[0], group_size=G, bias=bias)
    torch.testing.assert_close(torch_gemm.gemm(a, b[0], **opts), ref_gemm.gemm(a, b[0], **opts))
    ends = torch.tensor([0, 4, 4, 7], dtype=torch.int32)  # groups 0 and 2 empty, rows 7 and 8 past the last
    opts = dict(b_scale=s, b_zero_point=z, group_size=G)
    got = torch_gemm.grouped_gemm(a, b, ends, out_dtype=torch.float32, **opts)
    torch.testing.assert_close(got, ref_gemm.grouped_gemm(a, b, ends, out_dtype=torch.float32, **opts))
    assert not got[7:].any()


@pytest.mark.parametrize("zp, dtype", [(True, torch.bfloat16), (False, torch.float32)])
def test_fused_moe_matches_the_reference_and_dequantizes_only_the_experts_with_tokens(monkeypatch, zp, dtype):
    experts = _experts(zp)
    x, weights = torch.randn(M, H, generator=GEN, dtype=dtype), torch.rand(M, TOP, generator=GEN)
    ids = torch.tensor([[1, 3], [3, 4], [1, 4], [4, 3], [1, 3]], dtype=torch.int32)  # experts 0, 2, 5 idle
    seen = []
    dequantize = _int4.dequantize
    monkeypatch.setattr(_int4, "dequantize", lambda b, *rest: seen.append(b.shape[0]) or dequantize(b, *rest))
    got = torch_moe.fused_moe(x, weights=weights, ids=ids, **experts)
    want = ref_moe.fused_moe(x, weights=weights, ids=ids, **experts)
    torch.testing.assert_close(got, want)
    assert seen == [3, 3]  # w13's and w2's three experts in use
    empty = torch_moe.fused_moe(x[:0], weights=weights[:0], ids=ids[:0], **experts)
    assert empty.shape == (0, H) and empty.dtype == dtype


def test_w4a16_ops_trace_without_a_graph_break():
    """fullgraph: gemm's dequantization is traced, fused_moe is one opaque op (its ids are read on the host)."""
    experts = _experts(True)
    b, s = _packed(24, 23), _scales(24, 3)
    x, weights = torch.randn(M, H, generator=GEN), torch.rand(M, TOP, generator=GEN)
    ids = torch.randint(0, E, (M, TOP), generator=GEN, dtype=torch.int32)

    def step(x):
        y = torch_moe.fused_moe(x, weights=weights, ids=ids, **experts)
        return torch_gemm.gemm(y, b, b_scale=s, group_size=G)

    compiled = torch.compile(step, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), step(x))
