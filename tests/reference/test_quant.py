"""The reference quantized ops of spec 1.4 against independent formulations.

quantize_activation: a vLLM-style per-token-group quantization written here with torch in float32
(compared bit for bit), powers of two for ue8m0, ties to even for int8, the asymmetric range.
scaled_grouped_gemm: a per-group loop over float64 dequantized matrices. fused_moe's quantized mode:
the spec's composition spelled out with the reference's own ops, and weight-only against float weights.
"""

from __future__ import annotations

import math

import pytest
import torch

from hetero import OpError
from hetero.spec.gemm import QMAX
from hetero_cpu_ref import moe
from hetero_cpu_ref.quant import quantize_activation, scaled_grouped_gemm, ue8m0

FP8 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int32)


def group_quant(x: torch.Tensor, dtype: torch.dtype, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's per_token_group_quant_fp8, written out: K a multiple of group."""
    m, k = x.shape
    qmax = QMAX[dtype]
    xg = x.float().reshape(m, k // group, group)
    s = xg.abs().amax(dim=-1, keepdim=True).clamp(min=1e-10) / qmax
    return (xg / s).clamp(-qmax, qmax).to(dtype).reshape(m, k), s.squeeze(-1)


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("xdt", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("group", [128, 64])
def test_group_quant_matches_the_plain_formula_bit_for_bit(dtype, xdt, group):
    x = (torch.randn(9, 1024, generator=gen(1)) * torch.exp(torch.randn(1024, generator=gen(2)))).to(xdt)
    q, s = quantize_activation(x, dtype=dtype, group_size=group)
    want_q, want_s = group_quant(x, dtype, group)
    assert q.dtype == dtype and s.dtype == torch.float32 and s.shape == (9, 1024 // group)
    assert torch.equal(bits(q), bits(want_q)) and torch.equal(bits(s), bits(want_s))


def test_float64_input_is_rounded_to_float32_first():
    x = torch.randn(4, 256, generator=gen(3), dtype=torch.float64)
    for a, b in zip(quantize_activation(x, dtype=FP8[0]), quantize_activation(x.float(), dtype=FP8[0])):
        assert torch.equal(bits(a), bits(b))


def test_partial_last_group_uses_only_its_columns():
    x = torch.randn(3, 576, generator=gen(4))
    x[:, 512:] *= 0.01  # the last group (64 columns) is small: a scale padded with other columns would be wrong
    q, s = quantize_activation(x, dtype=FP8[0], group_size=128)
    assert s.shape == (3, 5)
    assert torch.equal(s[:, 4], x[:, 512:].abs().amax(dim=1).clamp(min=1e-10) / 448.0)
    full_q, _ = group_quant(torch.nn.functional.pad(x, (0, 64)), FP8[0], 128)
    assert torch.equal(bits(q), bits(full_q[:, :576]))  # zero padding changes no amax


def test_ue8m0_scales_are_the_smallest_power_of_two_at_or_above():
    x = torch.randn(16, 7168, generator=gen(5)) * torch.logspace(-6, 6, 16)[:, None]
    _, s_float = quantize_activation(x, dtype=FP8[0], scale_fmt="float")
    q, s = quantize_activation(x, dtype=FP8[0], scale_fmt="ue8m0")
    for raw, p2 in zip(s_float.flatten().tolist(), s.flatten().tolist()):
        assert p2 == 2.0 ** math.ceil(math.log2(raw))
    exact = torch.tensor([2.0**-20, 0.25, 1.0, 2.0**30, 3.0 * 2**-10, 1.0000001])
    assert ue8m0(exact).tolist() == [2.0**-20, 0.25, 1.0, 2.0**30, 2.0**-8, 2.0]
    want = (x.reshape(16, 56, 128) / s[..., None]).clamp(-448, 448).to(FP8[0]).reshape(16, 7168)
    assert torch.equal(bits(q), bits(want))


def test_fnuz_uses_qmax_224():
    x = torch.randn(4, 256, generator=gen(6))
    q, s = quantize_activation(x, dtype=torch.float8_e4m3fnuz, group_size=None)
    assert torch.equal(s[:, 0], x.abs().amax(dim=1) / 224.0)
    assert q.float().abs().amax() == 224.0


def test_int8_rounds_half_to_even_and_zero_rows_use_the_floor():
    x = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -2.5, 126.5], [0.0] * 7])
    q, s = quantize_activation(x, dtype=torch.int8, group_size=None)
    assert q[0].tolist() == [127, 0, 2, 2, 0, -2, 126] and s[0, 0] == 1.0
    assert q[1].tolist() == [0] * 7 and s[1, 0] == torch.tensor(1e-10, dtype=torch.float32) / 127.0


def test_asymmetric_int8_matches_its_formula_and_dequantizes_within_a_step():
    x = torch.randn(5, 300, generator=gen(7)) + torch.linspace(-3, 3, 5)[:, None]
    q, s, zp = quantize_activation(x, dtype=torch.int8, group_size=100, asymmetric=True)
    xg = x.reshape(5, 3, 100)
    lo, hi = xg.amin(-1).clamp(max=0), xg.amax(-1).clamp(min=0)  # the range always holds 0
    want_s = (hi - lo).clamp(min=1e-10) / 255.0
    want_zp = torch.round(-128.0 - lo / want_s).clamp(-128, 127)
    assert torch.equal(s, want_s) and torch.equal(zp, want_zp.int()) and zp.dtype == torch.int32
    deq = (q.reshape(5, 3, 100).float() - zp[..., None]) * s[..., None]
    # rows 0 and 4 are groups of one sign: with 0 in the range they still dequantize within a step
    assert (xg[0] < 0).all() and (xg[4] > 0).all()
    assert ((deq - xg).abs() <= s[..., None] * 1.0001).all()
    assert (zp >= -128).all() and (zp <= 127).all()


def test_no_rows_and_bad_options():
    q, s = quantize_activation(torch.randn(0, 576), dtype=FP8[0])
    assert q.shape == (0, 576) and s.shape == (0, 5)
    for kw, arg in [
        ({"dtype": torch.bfloat16}, "dtype"),
        ({"dtype": FP8[0], "group_size": 0}, "group_size"),
        ({"dtype": FP8[0], "scale_fmt": "e8m0"}, "scale_fmt"),
        ({"dtype": FP8[0], "asymmetric": True}, "asymmetric"),
    ]:
        with pytest.raises(OpError) as info:
            quantize_activation(torch.randn(2, 64), **kw)
        assert info.value.arg == arg


# ---------------------------------------------------------------- scaled_grouped_gemm


def _expand(s: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """A 2-D scale as [rows, cols] float64: one element, per row [rows, 1], or 128-blocks."""
    s = s.double().reshape(1, 1) if s.numel() == 1 else s.double()
    if s.shape[0] not in (1, rows):
        s = s.repeat_interleave(128, dim=0)[:rows]
    return (s.repeat_interleave(128, dim=1)[:, :cols] if s.shape[1] > 1 else s).expand(rows, cols)


def _operands(qdtype, m, g, n, k, a_form, b_form, seed):
    a = (torch.randn(m, k, generator=gen(seed)) * 8).clamp(-100, 100).round().to(qdtype)
    b = (torch.randn(g, n, k, generator=gen(seed + 1)) * 8).clamp(-100, 100).round().to(qdtype)
    kb, nb = -(-k // 128), -(-n // 128)
    sa = {"block": (m, kb), "row": (m, 1), "tensor": (1,)}[a_form]
    sb = {"block": (g, nb, kb), "row": (g, n, 1), "group": (g,)}[b_form]
    return a, b, torch.rand(sa, generator=gen(seed + 2)) + 0.5, torch.rand(sb, generator=gen(seed + 3)) + 0.5


@pytest.mark.parametrize("qdtype", [*FP8, torch.int8])
@pytest.mark.parametrize("a_form, b_form", [("block", "block"), ("row", "row"), ("tensor", "group"), ("row", "block")])
def test_scaled_grouped_gemm_matches_a_loop_over_dequantized_float64(qdtype, a_form, b_form):
    m, g, n, k = 13, 4, 300, 1000  # partial 128-blocks in N and K
    a, b, sa, sb = _operands(qdtype, m, g, n, k, a_form, b_form, seed=10)
    ends = torch.tensor([3, 3, 9, 11], dtype=torch.int32)  # an empty group, 2 rows past the last group
    out = scaled_grouped_gemm(a, b, sa, sb, ends, out_dtype=torch.float32)
    a64 = a.double() * _expand(sa, m, k)
    want, start = torch.zeros(m, n, dtype=torch.float64), 0
    for e, end in enumerate(ends.tolist()):
        sbe = sb[e].reshape(1) if b_form == "group" else sb[e]
        want[start:end] = a64[start:end] @ (b[e].double() * _expand(sbe, n, k)).T
        start = end
    assert torch.allclose(out.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max()), (
        (out.double() - want).abs().max()
    )
    assert (out[11:] == 0).all()


def test_zero_points_shift_int8_activations():
    a, b, sa, sb = _operands(torch.int8, 8, 2, 64, 256, "row", "row", seed=20)
    zp = torch.randint(-20, 20, (8, 1), generator=gen(21), dtype=torch.int32)
    ends = torch.tensor([5, 8], dtype=torch.int32)
    out = scaled_grouped_gemm(a, b, sa, sb, ends, a_zero_point=zp, out_dtype=torch.float32)
    a64 = (a.double() - zp.double()) * sa.double()
    want = torch.cat([a64[:5] @ (b[0].double() * sb[0].double()).T, a64[5:] @ (b[1].double() * sb[1].double()).T])
    assert torch.allclose(out.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max())
    with pytest.raises(OpError) as info:
        scaled_grouped_gemm(a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn), sa, sb, ends, a_zero_point=zp)
    assert info.value.arg == "a_zero_point"


# ---------------------------------------------------------------- fused_moe, quantized


def _moe_inputs(seed: int, qdtype: torch.dtype, e: int = 4, h: int = 256, inter: int = 192, m: int = 5, k: int = 2):
    w13 = (torch.randn(e, 2 * inter, h, generator=gen(seed)) * 20).clamp(-120, 120).round().to(qdtype)
    w2 = (torch.randn(e, h, inter, generator=gen(seed + 1)) * 20).clamp(-120, 120).round().to(qdtype)
    s13 = torch.rand(e, -(-2 * inter // 128), -(-h // 128), generator=gen(seed + 2)) * 2e-3 + 1e-3
    s2 = torch.rand(e, -(-h // 128), -(-inter // 128), generator=gen(seed + 3)) * 2e-3 + 1e-3
    ids = torch.stack([torch.randperm(e, generator=gen(seed + 4 + i))[:k] for i in range(m)]).int()
    weights = torch.rand(m, k, generator=gen(seed + 20)).softmax(dim=1)
    x = torch.randn(m, h, generator=gen(seed + 21)).bfloat16()
    return x, w13, w2, weights, ids, s13, s2


@pytest.mark.parametrize("act_quant, fmt", [("group128", "float"), ("group128", "ue8m0"), ("token", "float")])
def test_fused_moe_quantized_is_the_spec_composition(act_quant, fmt):
    x, w13, w2, weights, ids, s13, s2 = _moe_inputs(30, torch.float8_e4m3fn)
    b13, b2 = torch.randn(4, 384, generator=gen(40)).bfloat16(), torch.randn(4, 256, generator=gen(41)).bfloat16()
    got = moe.fused_moe(
        x,
        w13,
        w2,
        weights,
        ids,
        w13_bias=b13,
        w2_bias=b2,
        w13_scale=s13,
        w2_scale=s2,
        act_quant=act_quant,
        act_scale_fmt=fmt,
    )
    group = 128 if act_quant == "group128" else None
    xs, ends, perm = moe.moe_permute(x, ids, 4)
    rows_bias = lambda bias: bias.float().repeat_interleave(torch.diff(ends, prepend=ends.new_zeros(1)).long(), dim=0)  # noqa: E731

    def linear(a, w, s, bias):
        q, sa = quantize_activation(a, dtype=w.dtype, group_size=group, scale_fmt=fmt)
        return (scaled_grouped_gemm(q, w, sa, s, ends, out_dtype=torch.float32) + rows_bias(bias)).bfloat16()

    gu = linear(xs, w13, s13, b13).float()
    h = (torch.nn.functional.silu(gu[:, :192]) * gu[:, 192:]).bfloat16()
    want = moe.moe_unpermute(linear(h, w2, s2, b2), perm, weights)
    assert torch.equal(got, want)


def test_fused_moe_weight_only_is_the_float_op_on_dequantized_weights():
    x, w13, w2, weights, ids, s13, s2 = _moe_inputs(50, torch.int8)
    x = x.float()

    def deq(w, s):
        return w.float() * s.repeat_interleave(128, 1)[:, : w.shape[1]].repeat_interleave(128, 2)[..., : w.shape[2]]

    got = moe.fused_moe(x, w13, w2, weights, ids, w13_scale=s13, w2_scale=s2)
    want = moe.fused_moe(x, deq(w13, s13), deq(w2, s2), weights, ids)
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-6 * want.abs().max())


def test_fused_moe_quantized_options_are_checked():
    x, w13, w2, weights, ids, s13, s2 = _moe_inputs(60, torch.float8_e4m3fn)
    bad = [
        ({"w13_scale": s13}, "w2_scale"),
        ({"w13_scale": s13, "w2_scale": s2, "act_quant": "int4"}, "act_quant"),
        ({"w13_scale": s13, "w2_scale": s2, "act_scale_fmt": "pow2"}, "act_scale_fmt"),
        ({}, "w13_scale"),
    ]
    for kw, arg in bad:
        with pytest.raises(OpError) as info:
            moe.fused_moe(x, w13, w2, weights, ids, **kw)
        assert info.value.arg == arg
    with pytest.raises(OpError) as info:
        moe.fused_moe(x, w13.bfloat16(), w2.bfloat16(), weights, ids, act_quant="token")
    assert info.value.arg == "act_quant"
