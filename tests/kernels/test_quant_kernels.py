"""Triton quantized kernels under the interpreter: quantize_activation bit for bit (against torch's
own conversions and the reference), scaled_grouped_gemm against float64 on dequantized operands,
fused_moe's quantized mode against the reference composition."""

from __future__ import annotations

import pytest
import torch

from hetero.kernels.tuning import Tuning, TuningTable
from hetero.spec.gemm import QMAX

FN, FNUZ, I8 = torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.int8
QUANTS = (FN, FNUZ, I8)


@pytest.fixture
def tune():
    return Tuning(TuningTable(vendor="portable"), "interpreter", interpreted=True)


def _rne(v: torch.Tensor) -> torch.Tensor:
    return torch.round(v)  # torch.round rounds half to even


def _own_quantize(x, dtype, group_size, ue8m0=False, asymmetric=False):
    """The spec's formulas in float32 with torch's correctly rounded ops (an independent oracle)."""
    x = x.float()
    m, k = x.shape
    gs = k if group_size is None else group_size
    qs, ss, zs = [], [], []
    for c0 in range(0, max(k, 1) if group_size is None else k, max(gs, 1)):
        xg = x[:, c0 : c0 + gs]
        if asymmetric:
            lo, hi = xg.amin(1, keepdim=True).clamp(max=0), xg.amax(1, keepdim=True).clamp(min=0)
            s = torch.clamp(hi - lo, min=1e-10) / 255
        else:
            s = (
                torch.clamp(xg.abs().amax(1, keepdim=True) if xg.shape[1] else torch.zeros(m, 1), min=1e-10)
                / QMAX[dtype]
            )
        if ue8m0:
            s = torch.exp2(torch.ceil(torch.log2(s.double()))).float()
        if asymmetric:
            zp = torch.clamp(_rne(-128 - lo / s), -128, 127)
            q = torch.clamp(_rne(xg / s) + zp, -128, 127).to(I8)
            zs.append(zp.to(torch.int32))
        else:
            y = torch.clamp(xg / s, -QMAX[dtype], QMAX[dtype])
            q = torch.clamp(_rne(y), -128, 127).to(I8) if dtype == I8 else y.to(dtype)
        qs.append(q)
        ss.append(s)
    q = torch.cat(qs, 1) if qs else torch.empty(m, k, dtype=dtype)
    out = (q, torch.cat(ss, 1) if ss else torch.empty(m, 0))
    return out + (torch.cat(zs, 1),) if asymmetric else out


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype in (FN, FNUZ) else t


@pytest.mark.parametrize("dtype", [FN, FNUZ])
def test_fp8_rounding_every_code_and_midpoint(dtype, tune):
    """Scale 1 (a group whose amax is qmax): every code, every midpoint (ties to even), the floats
    either side of each midpoint and tiny values, of both signs, against torch's conversion."""
    from hetero.kernels.quant import quantize_activation

    qmax = QMAX[dtype]
    codes = torch.arange(0, 128, dtype=torch.uint8).view(dtype).float()
    codes = codes[codes <= qmax]
    mids = (codes[1:] + codes[:-1]) / 2
    vals = torch.cat(
        [
            codes,
            mids,
            torch.nextafter(mids, torch.zeros(())),
            torch.nextafter(mids, torch.full((), 1e9)),
            torch.tensor([1e-30, 2.0**-11, 3 * 2.0**-12, 2.0**-12]),
        ]
    )
    vals = torch.cat([vals, -vals])
    per = 127
    rows = -(-vals.numel() // per)
    x = torch.full((rows * per,), 0.25)
    x[: vals.numel()] = vals
    x = torch.cat([x.reshape(rows, per), torch.full((rows, 1), qmax)], 1)
    q, s = quantize_activation(x, dtype=dtype, group_size=128, tuning=tune)
    assert torch.equal(s, torch.ones(rows, 1))
    assert torch.equal(q.view(torch.uint8), x.to(dtype).view(torch.uint8))


def test_int8_rounding_ties_to_even(tune):
    from hetero.kernels.quant import quantize_activation

    vals = torch.arange(-1270, 1271, dtype=torch.float32) / 10  # every tenth: ties at .5
    x = torch.cat([vals, torch.tensor([127.0] * 9)]).reshape(-1, 10)
    q, s = quantize_activation(x, dtype=I8, group_size=None, tuning=tune)
    want = _own_quantize(x, I8, None)
    assert torch.equal(s, want[1]) and torch.equal(q, want[0])


@pytest.mark.parametrize("dtype", QUANTS)
@pytest.mark.parametrize("group_size", [128, 48, None])
@pytest.mark.parametrize("fmt", ["float", "ue8m0"])
def test_quantize_matches_formulas(dtype, group_size, fmt, tune):
    from hetero.kernels.quant import quantize_activation

    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(9, 200, generator=gen) * torch.logspace(-3, 2, 9)[:, None]).bfloat16()
    x[4, 17] = 0.0
    x[5] = 0.0  # an all-zero group: amax floored
    got = quantize_activation(x, dtype=dtype, group_size=group_size, scale_fmt=fmt, tuning=tune)
    want = _own_quantize(x, dtype, group_size, ue8m0=fmt == "ue8m0")
    assert torch.equal(got[1], want[1])
    assert torch.equal(_bits(got[0]), _bits(want[0]))


@pytest.mark.parametrize("group_size", [128, None])
def test_quantize_asymmetric_int8(group_size, tune):
    from hetero.kernels.quant import quantize_activation

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(6, 160, generator=gen) * 3 + torch.arange(6)[:, None] - 2
    x[2] = x[2].abs()  # all positive: zp clamps at -128
    got = quantize_activation(x, dtype=I8, group_size=group_size, asymmetric=True, tuning=tune)
    want = _own_quantize(x, I8, group_size, asymmetric=True)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_quantize_edges_and_strides(tune):
    from hetero.kernels.quant import quantize_activation

    q, s = quantize_activation(torch.randn(0, 64), dtype=FN, tuning=tune)
    assert q.shape == (0, 64) and s.shape == (0, 1)
    base = torch.randn(64, 10, dtype=torch.float16)
    x = base.t()  # a strided [10, 64] view
    got = quantize_activation(x, dtype=FN, group_size=32, tuning=tune)
    want = _own_quantize(x, FN, 32)
    assert torch.equal(got[1], want[1]) and torch.equal(_bits(got[0]), _bits(want[0]))


def test_quantize_rejects_bad_arguments(tune):
    from hetero import OpError
    from hetero.kernels.quant import quantize_activation

    x = torch.randn(4, 64)
    for kw in (
        {"dtype": torch.float16},
        {"dtype": FN, "group_size": 0},
        {"dtype": FN, "scale_fmt": "e8m0"},
        {"dtype": FN, "asymmetric": True},
    ):
        with pytest.raises(OpError):
            quantize_activation(x, tuning=tune, **kw)


# ----------------------------------------------------------------------------- scaled_grouped_gemm


def _quantize_weights(w: torch.Tensor, dtype: torch.dtype, form: str):
    """(b, b_scale) of float weights [G, N, K] in a grouped b_scale form."""
    g, n, k = w.shape
    qmax = QMAX[dtype]
    if form == "group":
        s = w.abs().amax((1, 2)).clamp(min=1e-10) / qmax
        full = s[:, None, None].expand(g, n, k)
    elif form == "row":
        s = w.abs().amax(2, keepdim=True).clamp(min=1e-10) / qmax
        full = s.expand(g, n, k)
    else:
        nb, kb = -(-n // 128), -(-k // 128)
        pad = torch.zeros(g, nb * 128, kb * 128)
        pad[:, :n, :k] = w.abs()
        s = pad.reshape(g, nb, 128, kb, 128).amax((2, 4)).clamp(min=1e-10) / qmax
        full = s.repeat_interleave(128, 1).repeat_interleave(128, 2)[:, :n, :k]
    y = (w / full).clamp(-qmax, qmax)
    b = torch.round(y).to(dtype) if dtype == I8 else y.to(dtype)
    return b, s.float()


def _dequant_a(a, a_scale, zp):
    m, k = a.shape
    s = a_scale.double()
    if s.numel() == 1 and m != 1:
        s = s.reshape(1, 1).expand(m, k)
    elif s.shape[1] == 1:
        s = s.expand(m, k)
    else:
        s = s.repeat_interleave(128, 1)[:, :k]
    av = a.double() if zp is None else a.double() - zp.double()
    return av * s


def _dequant_b(b, b_scale, form):
    g, n, k = b.shape
    s = b_scale.double()
    if form == "group":
        s = s[:, None, None].expand(g, n, k)
    elif form == "row":
        s = s.expand(g, n, k)
    else:
        s = s.repeat_interleave(128, 1).repeat_interleave(128, 2)[:, :n, :k]
    return b.double() * s


def _oracle(a, b, a_scale, b_scale, ends, b_form, zp=None):
    da, db = _dequant_a(a, a_scale, zp), _dequant_b(b, b_scale, b_form)
    out = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64)
    start = 0
    for g, end in enumerate(ends):
        end = max(start, min(end, a.shape[0]))
        out[start:end] = da[start:end] @ db[g].T
        start = end
    return out


_GEMM_CASES = [  # (dtype, a form, b form, M, N, K)
    (FN, "block", "block", 11, 200, 300),
    (FNUZ, "block", "block", 9, 130, 256),
    (FN, "row", "row", 10, 96, 160),
    (I8, "block", "block", 12, 136, 260),
    (I8, "row", "row", 10, 64, 200),
    (FN, "tensor", "group", 7, 48, 64),
    (I8, "tensor", "block", 8, 130, 129),
]


@pytest.mark.parametrize("case", _GEMM_CASES, ids=lambda c: f"{str(c[0])[6:]}-{c[1]}-{c[2]}")
def test_scaled_grouped_gemm_matches_float64(case, tune):
    from hetero.kernels.quant import quantize_activation, scaled_grouped_gemm

    dtype, a_form, b_form, m, n, k = case
    gen = torch.Generator().manual_seed(m * 7 + n)
    x = torch.randn(m, k, generator=gen)
    if a_form == "block":
        a, a_scale = quantize_activation(x, dtype=dtype, group_size=128, tuning=tune)
    elif a_form == "row":
        a, a_scale = quantize_activation(x, dtype=dtype, group_size=None, tuning=tune)
    else:
        a_scale = (x.abs().amax() / QMAX[dtype]).reshape(1)
        y = (x / a_scale).clamp(-QMAX[dtype], QMAX[dtype])
        a = torch.round(y).to(dtype) if dtype == I8 else y.to(dtype)
    b, b_scale = _quantize_weights(torch.randn(3, n, k, generator=gen) / k**0.5, dtype, b_form)
    ends = torch.tensor([3, 3, m - 2], dtype=torch.int32)  # an empty group and 2 rows past the last one
    out = scaled_grouped_gemm(a, b, a_scale, b_scale, ends, out_dtype=torch.float32, tuning=tune)
    want = _oracle(a, b, a_scale, b_scale, ends.tolist(), b_form)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    assert torch.equal(out[m - 2 :], torch.zeros(2, n))


def test_scaled_grouped_gemm_zero_point_and_reference(tune):
    from hetero.kernels.quant import quantize_activation, scaled_grouped_gemm
    from hetero_cpu_ref.quant import scaled_grouped_gemm as ref

    gen = torch.Generator().manual_seed(11)
    m, n, k = 9, 72, 200
    x = torch.randn(m, k, generator=gen) + 1.5
    a, a_scale, zp = quantize_activation(x, dtype=I8, group_size=None, asymmetric=True, tuning=tune)
    b, b_scale = _quantize_weights(torch.randn(2, n, k, generator=gen) / k**0.5, I8, "block")
    ends = torch.tensor([4, 9], dtype=torch.int64)
    for dt in (torch.bfloat16, torch.float32):
        out = scaled_grouped_gemm(a, b, a_scale, b_scale, ends, a_zero_point=zp, out_dtype=dt, tuning=tune)
        want = _oracle(a, b, a_scale, b_scale, ends.tolist(), "block", zp)
        tol = 1e-5 if dt == torch.float32 else 8e-3
        torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol)
        torch.testing.assert_close(
            out, ref(a, b, a_scale, b_scale, ends, a_zero_point=zp, out_dtype=dt), rtol=tol, atol=tol
        )


# ----------------------------------------------------------------------------- fused_moe, quantized

_MOE_CASES = [  # (weight dtype, scale form, act_quant, act_scale_fmt, activation, bias)
    (FN, "block", "group128", "float", "silu", False),
    (FNUZ, "block", "group128", "ue8m0", "swigluoai", True),
    (I8, "row", "token", "float", "silu", True),
    (FN, "group", "token", "float", "swiglu_clamp", False),
    (FN, "block", None, "float", "silu", True),
    (I8, "row", None, "float", "silu", False),
]


@pytest.mark.parametrize("case", _MOE_CASES, ids=lambda c: f"{str(c[0])[6:]}-{c[1]}-{c[2]}-{c[4]}")
def test_fused_moe_quantized_matches_reference(case, tune):
    from hetero.kernels.moe import fused_moe
    from hetero_cpu_ref.moe import fused_moe as ref

    dtype, form, act_quant, fmt, activation, bias = case
    gen = torch.Generator().manual_seed(17)
    m, hidden, inter, experts, k = 7, 160, 144, 4, 2
    x = torch.randn(m, hidden, generator=gen).bfloat16()
    w13, s13 = _quantize_weights(torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5, dtype, form)
    w2, s2 = _quantize_weights(torch.randn(experts, hidden, inter, generator=gen) / inter**0.5, dtype, form)
    weights = torch.rand(m, k, generator=gen)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(m)]).to(torch.int32)
    ids[0] = torch.tensor([3, 1])
    kw = {"activation": activation, "w13_scale": s13, "w2_scale": s2, "act_quant": act_quant, "act_scale_fmt": fmt}
    if activation != "silu":
        kw["limit"] = 7.0
    if bias:
        kw["w13_bias"] = torch.randn(experts, 2 * inter, generator=gen).bfloat16()
        kw["w2_bias"] = torch.randn(experts, hidden, generator=gen).bfloat16()
    got = fused_moe(x, w13, w2, weights, ids, tuning=tune, **kw)
    want = ref(x, w13, w2, weights, ids, **kw)
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2)  # identical in practice


def test_fused_moe_quantized_rejects_bad_options(tune):
    from hetero import OpError
    from hetero.kernels.moe import fused_moe

    x, weights, ids = torch.randn(3, 8), torch.rand(3, 2), torch.tensor([[0, 1], [1, 0], [0, 1]], dtype=torch.int32)
    w13, w2 = torch.randn(2, 12, 8), torch.randn(2, 8, 6)
    with pytest.raises(OpError):  # activation quantization needs quantized weights
        fused_moe(x, w13, w2, weights, ids, act_quant="token", tuning=tune)
    q13, q2 = w13.to(FN), w2.to(FN)
    with pytest.raises(OpError):  # quantized weights need their scales
        fused_moe(x, q13, q2, weights, ids, tuning=tune)
    with pytest.raises(OpError):
        fused_moe(
            x, q13, q2, weights, ids, w13_scale=torch.ones(2), w2_scale=torch.ones(2), act_quant="group64", tuning=tune
        )
    out = fused_moe(
        x[:0],
        q13,
        q2,
        weights[:0],
        ids[:0],
        w13_scale=torch.ones(2),
        w2_scale=torch.ones(2),
        act_quant="token",
        tuning=tune,
    )
    assert out.shape == (0, 8)
