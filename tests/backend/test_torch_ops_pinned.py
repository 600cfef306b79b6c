"""hetero-torch's Python ops against the reference on small inputs chosen to reach their edges (a few ms each;
the conformance catalog in test_torch_backend.py covers them all at model shapes, in minutes): the interleaved
and partial rotary, rms_norm where eps matters, ue8m0 and asymmetric quantize_activation (bit for bit),
and merge_attention with unequal sides."""

from __future__ import annotations

import pytest
import torch

import hetero

pytest.importorskip("hetero_torch")


@pytest.fixture(scope="module")
def ops():
    return hetero.load("torch"), hetero.load("cpu_ref")


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rot", [8, 16])
def test_rotary_neox_and_interleaved_full_and_partial(ops, is_neox, rot):
    torch_ops, ref = ops
    g = _gen(1)
    q, k = torch.randn(5, 4, 16, generator=g), torch.randn(5, 2, 16, generator=g)
    angles = torch.arange(12, dtype=torch.float32)[:, None] * torch.rand(rot // 2, generator=g)[None] * 3
    cache = torch.cat((angles.cos(), angles.sin()), dim=-1)
    positions = torch.tensor([0, 3, 7, 11, 2])
    got = torch_ops.rotary_embedding(positions, q, k, cache, is_neox=is_neox)
    want = ref.rotary_embedding(positions, q, k, cache, is_neox=is_neox)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert torch.equal(got[0][..., rot:], q[..., rot:]), "dims past rot pass through"


@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm_where_eps_is_as_large_as_the_mean_square(ops, offset):
    torch_ops, ref = ops
    g = _gen(2)
    x = torch.randn(6, 64, generator=g) * torch.tensor([1e-3, 1e-2, 1.0, 3e-4, 1e-3, 5.0])[:, None]
    w = torch.randn(64, generator=g)
    got = torch_ops.rms_norm(x, w, 1e-6, weight_offset=offset)
    torch.testing.assert_close(got, ref.rms_norm(x, w, 1e-6, weight_offset=offset), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "dtype, scale_fmt, asymmetric",
    [
        (torch.float8_e4m3fn, "ue8m0", False),
        (torch.float8_e4m3fn, "float", False),
        (torch.int8, "float", True),
        (torch.int8, "float", False),
    ],
)
def test_quantize_activation_is_bit_exact(ops, dtype, scale_fmt, asymmetric):
    torch_ops, ref = ops
    g = _gen(3)
    x = torch.randn(5, 300, generator=g) * torch.tensor([1.0, 7.0, 0.01, 448.0, 3.0])[:, None]
    x[1] = x[1].abs() + 0.5  # one row of one sign: the zero point is at an end
    x[3, :128] = torch.linspace(-448 * 4, 448 * 4, 128)  # amax / 448 exactly a power of two: ue8m0 keeps it
    kw = dict(dtype=dtype, group_size=128, scale_fmt=scale_fmt, asymmetric=asymmetric)
    got, want = torch_ops.quantize_activation(x, **kw), ref.quantize_activation(x, **kw)
    assert len(got) == len(want) == (3 if asymmetric else 2)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(
            a.view(torch.uint8) if a.element_size() == 1 else a, b.view(torch.uint8) if b.element_size() == 1 else b
        )
    if scale_fmt == "ue8m0":
        assert got[1][3, 0] == 4.0


def test_merge_attention_weighs_each_side_by_its_own_lse(ops):
    torch_ops, ref = ops
    g = _gen(4)
    out_a, out_b = torch.randn(4, 3, 8, generator=g), torch.randn(4, 3, 8, generator=g)
    lse_a, lse_b = torch.randn(4, 3, generator=g) * 3, torch.randn(4, 3, generator=g) * 3
    lse_b[0, 0] = float("-inf")  # an empty side
    lse_a[1, 1] = lse_b[1, 1] = float("-inf")  # both empty
    got, want = torch_ops.merge_attention(out_a, lse_a, out_b, lse_b), ref.merge_attention(out_a, lse_a, out_b, lse_b)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
