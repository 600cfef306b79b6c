"""The reference's packed int4 weights (spec 1.9, W4A16) against independent formulations: the
dequantization element by element in numpy float32, compressed-tensors' int32 packing, and the
grouped and fused ops as compositions of the float ones on the dequantized weights."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

import hetero
from hetero_cpu_ref import gemm as ref_gemm
from hetero_cpu_ref import moe as ref_moe
from hetero_cpu_ref._int4 import dequantize_int4

GEN = torch.Generator().manual_seed(35)


def _packed(*shape: int) -> torch.Tensor:
    return torch.randint(0, 256, shape, generator=GEN, dtype=torch.uint8)


def _scales(*shape: int) -> torch.Tensor:
    return torch.rand(shape, generator=GEN) * 0.1 + 1e-3


def _zero_points(*shape: int) -> torch.Tensor:
    return torch.randint(0, 16, shape, generator=GEN, dtype=torch.uint8)


def _spec_dequant(b, scale, zp, g, k) -> np.ndarray:
    """The module docstring of hetero.spec.gemm, one element at a time, in numpy float32."""
    b, scale = b.numpy(), scale.numpy()
    w = np.empty((b.shape[0], k), dtype=np.float32)
    for n in range(b.shape[0]):
        for col in range(k):
            byte = int(b[n, col // 2])
            q = byte & 0xF if col % 2 == 0 else byte >> 4
            z = 8 if zp is None else int(zp[n, col // g])
            w[n, col] = np.float32(q - z) * scale[n, col // g]
    return w


@pytest.mark.parametrize("k, g, zp", [(37, 8, True), (64, 32, False), (9, 128, True)])
def test_dequantization_is_the_spec_formula_bit_for_bit(k, g, zp):
    """Odd K (the last high nibble, random here, is ignored), partial and oversized groups, zero points
    or the symmetric 8: dequantize_int4 and gemm on an identity activation give the spec's float32 values."""
    n = 6
    b, s = _packed(n, (k + 1) // 2), _scales(n, -(-k // g))
    z = _zero_points(*s.shape) if zp else None
    want = torch.from_numpy(_spec_dequant(b, s, z, g, k))
    assert torch.equal(dequantize_int4(b, s, z, g, k), want)
    eye = torch.eye(k, dtype=torch.float32)
    assert torch.equal(ref_gemm.gemm(eye, b, b_scale=s, b_zero_point=z, group_size=g).T, want)


@pytest.mark.skipif(sys.byteorder != "little", reason="the uint8 view of int32 words is little-endian's")
def test_a_compressed_tensors_int32_word_viewed_as_bytes_is_the_spec_encoding():
    """pack-quantized stores 8 codes an int32, code i in bits 4i..4i+3: its uint8 view is two codes a
    byte, the even column low (the spec's encoding), so a loader passes the view as is."""
    n, k, g = 4, 40, 8
    codes = torch.randint(0, 16, (n, k), generator=GEN, dtype=torch.int64)
    words = (codes.view(n, k // 8, 8) << (4 * torch.arange(8))).sum(-1)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    s = _scales(n, k // g)
    got = dequantize_int4(words.view(torch.uint8), s, None, g, k)
    want = (codes - 8).to(torch.float32) * s.repeat_interleave(g, dim=1)
    assert torch.equal(got, want)


def test_grouped_gemm_is_gemm_per_group_and_zero_past_the_last():
    k, n, g = 50, 12, 16
    b, s, z = _packed(4, n, k // 2), _scales(4, n, 4), _zero_points(4, n, 4)
    a = torch.randn(11, k, generator=GEN, dtype=torch.bfloat16)
    ends = torch.tensor([3, 3, 8, 9], dtype=torch.int32)  # group 1 empty, rows 9, 10 past the last group
    out = ref_gemm.grouped_gemm(a, b, ends, b_scale=s, b_zero_point=z, group_size=g)
    for grp, (lo, hi) in enumerate([(0, 3), (3, 3), (3, 8), (8, 9)]):
        one = ref_gemm.gemm(a[lo:hi], b[grp], b_scale=s[grp], b_zero_point=z[grp], group_size=g)
        torch.testing.assert_close(out[lo:hi], one)  # MKL may sum a differently aligned operand otherwise
    assert out.dtype == torch.bfloat16 and not out[9:].any()


@pytest.mark.parametrize("zp", [False, True])
def test_fused_moe_is_the_float_composition_on_the_dequantized_experts(zp):
    """float32 x: the W4A16 fused_moe equals the float fused_moe on the dequantized float32 experts (both
    the reference's composition, up to MKL's summation order); odd H and I, partial groups, an empty expert."""
    e, h, inter, g, m, top = 5, 21, 7, 4, 6, 2
    w13, w2 = _packed(e, 2 * inter, (h + 1) // 2), _packed(e, h, (inter + 1) // 2)
    s13, s2 = _scales(e, 2 * inter, -(-h // g)), _scales(e, h, -(-inter // g))
    z13, z2 = (_zero_points(*s13.shape), _zero_points(*s2.shape)) if zp else (None, None)
    x = torch.randn(m, h, generator=GEN)
    ids = torch.stack([torch.randperm(e - 1, generator=GEN)[:top] for _ in range(m)]).int()  # expert e-1 unused
    weights = torch.rand(m, top, generator=GEN)
    out = ref_moe.fused_moe(
        x, w13, w2, weights, ids, w13_scale=s13, w2_scale=s2, w13_zero_point=z13, w2_zero_point=z2, group_size=g
    )
    deq13 = torch.stack([dequantize_int4(w13[i], s13[i], None if z13 is None else z13[i], g, h) for i in range(e)])
    deq2 = torch.stack([dequantize_int4(w2[i], s2[i], None if z2 is None else z2[i], g, inter) for i in range(e)])
    torch.testing.assert_close(out, ref_moe.fused_moe(x, deq13, deq2, weights, ids), rtol=1e-5, atol=1e-5)


def test_the_reference_refuses_a_zero_point_past_15_and_float64_scales_with_float32_a():
    a, b, s = torch.randn(2, 8), _packed(3, 4), _scales(3, 1)
    with pytest.raises(hetero.OpError) as info:
        ref_gemm.gemm(a, b, b_scale=s, b_zero_point=torch.full((3, 1), 16, dtype=torch.uint8), group_size=8)
    assert info.value.arg == "b_zero_point" and "[0, 15]" in str(info.value)
    with pytest.raises(hetero.OpError) as info:
        ref_gemm.gemm(a, b, b_scale=s.double(), group_size=8)
    assert info.value.arg == "b_scale" and "float32" in str(info.value)
