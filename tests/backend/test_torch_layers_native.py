"""hetero-torch's native CPU rms_norm and silu_and_mul (``_layers_native``): float32 and bfloat16
against the float64 reference on real widths and odd ones (vector tails), the residual's rounded
sum, and the shapes the kernels refuse."""

from __future__ import annotations

import pytest
import torch

import hetero

pytest.importorskip("hetero_torch")
from hetero_torch import _layers_native as native  # noqa: E402

REF = hetero.load("cpu_ref")
OPS = hetero.load("torch")
BF16 = dict(atol=1e-5, rtol=2**-8)  # one rounding: within half an ulp, plus float32 accumulation


def _require_native():
    if not native.act_applies(torch.empty(1, 2)):
        pytest.skip("the native CPU kernels are not available here")


def _close(got, want, dtype):
    assert got.dtype == dtype
    tol = dict(atol=2e-6, rtol=2e-6) if dtype == torch.float32 else BF16
    torch.testing.assert_close(got.double(), want, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,width", [(1, 1024), (70, 2048), (5, 1000), (3, 7)])
def test_rms_norm_matches_float64(rows, width, dtype):
    _require_native()
    gen = torch.Generator().manual_seed(rows + width)
    x, res = (torch.randn(rows, width, generator=gen).to(dtype) for _ in range(2))
    weight = torch.randn(width, generator=gen).to(dtype)
    assert native.norm_applies(x, weight, res)
    _close(OPS.rms_norm(x, weight, 1e-6), REF.rms_norm(x.double(), weight.double(), 1e-6), dtype)
    got, h = OPS.rms_norm(x, weight, 1e-6, residual=res, weight_offset=1.0)
    # the reference's sum is rounded to the dtype before it is normalized, as the spec says
    want, want_h = REF.rms_norm(x, weight, 1e-6, residual=res, weight_offset=1.0)
    assert torch.equal(h, want_h)
    wide = REF.rms_norm(h.double(), weight.double(), 1e-6, weight_offset=1.0)
    _close(got, wide, dtype)


def test_rms_norm_of_bf16_rows_with_a_float32_weight_and_leading_dims():
    _require_native()
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 96, generator=gen).bfloat16()
    weight = torch.randn(96, generator=gen)
    got = OPS.rms_norm(x, weight, 1e-5)
    assert got.shape == x.shape
    _close(got, REF.rms_norm(x.double(), weight.double(), 1e-5), torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(16, 2 * 3072), (3, 2 * 13), (2, 5, 2 * 40)])
def test_silu_and_mul_matches_float64(shape, dtype):
    _require_native()
    gen = torch.Generator().manual_seed(shape[-1])
    x = (torch.randn(*shape, generator=gen) * 6).to(dtype)  # far into both tails of silu
    x.view(-1)[:2] = torch.tensor([-100.0, 90.0])
    _close(OPS.silu_and_mul(x), REF.silu_and_mul(x.double()), dtype)
    strided = torch.cat([x, x], dim=-1)[..., : shape[-1]]  # rows not contiguous
    _close(OPS.silu_and_mul(strided), REF.silu_and_mul(x.double()), dtype)


def test_the_kernels_refuse_what_they_would_misread():
    _require_native()
    ops = torch.ops.hetero_torch_native
    x = torch.randn(4, 8)
    with pytest.raises(RuntimeError, match="weight must be contiguous"):
        ops.rms_norm(x, torch.randn(9), 1e-6, None, 0.0)
    with pytest.raises(RuntimeError, match="residual must be"):
        ops.rms_norm(x, torch.randn(8), 1e-6, torch.randn(4, 8).bfloat16(), 0.0)
    with pytest.raises(RuntimeError, match="x must be contiguous float32 or bfloat16"):
        ops.rms_norm(x.double(), torch.randn(8), 1e-6, None, 0.0)
    with pytest.raises(RuntimeError, match=r"\[R, 2I\]"):
        ops.silu_and_mul(torch.randn(4, 7))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "is_neox,heads,kv_heads,dim,rot",
    [(True, 16, 8, 128, 128), (True, 4, 1, 80, 40), (False, 4, 2, 64, 64), (False, 2, 2, 72, 36)],
)
def test_rotary_embedding_matches_float64(is_neox, heads, kv_heads, dim, rot, dtype):
    """Full and partial rotary, neox and interleaved pairs, q a strided view of a fused qkv row."""
    _require_native()
    gen = torch.Generator().manual_seed(dim + rot)
    tokens, table_rows = 9, 50
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen).to(dtype)
    q = qkv[:, : heads * dim].view(tokens, heads, dim)
    k = qkv[:, heads * dim : (heads + kv_heads) * dim].view(tokens, kv_heads, dim)
    angles = torch.rand(table_rows, rot // 2, generator=gen) * 6
    cache = torch.cat([angles.cos(), angles.sin()], dim=-1)
    positions = torch.randint(0, table_rows, (tokens,), generator=gen)
    assert native.rotary_applies(positions, q, k, cache)
    got = OPS.rotary_embedding(positions, q, k, cache, is_neox=is_neox)
    want = REF.rotary_embedding(positions, q.double(), k.double(), cache.double(), is_neox=is_neox)
    for g, w in zip(got, want):
        _close(g, w, dtype)
    assert torch.equal(got[0][..., rot:], q[..., rot:])  # past rot: copied as is
