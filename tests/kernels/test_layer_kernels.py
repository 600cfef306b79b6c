"""The Triton glue-op kernels (rms_norm, layer_norm, rotary_embedding, silu_and_mul) against the reference,
through Triton's interpreter on CPU tensors."""

from __future__ import annotations

import pytest
import torch

from hetero.errors import OpError
from hetero_cpu_ref import layers as ref


@pytest.fixture(params=["interpreter", "gpu-tiles"])
def tune(request, triton_backend):
    """The interpreter's tuning, or the portable defaults a GPU gets (one row / token per program)."""
    from hetero.kernels.tuning import Tuning, TuningTable

    if request.param == "interpreter":
        return triton_backend.tune
    return Tuning(TuningTable(vendor="portable"), "generic", interpreted=False)


def _layers():
    from hetero.kernels import layers

    return layers


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _tol(dtype: torch.dtype) -> dict:
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1e-2}


# ----------------------------------------------------------------------------- rms_norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_with_and_without_residual(tune, dtype):
    g = _gen(1)
    x = torch.randn(5, 200, generator=g).to(dtype)
    res = torch.randn(5, 200, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(200, generator=g)).to(dtype)
    x0, r0 = x.clone(), res.clone()
    y = _layers().rms_norm(x, w, 1e-6, residual=None, tuning=tune)
    torch.testing.assert_close(y, ref.rms_norm(x, w, 1e-6), **_tol(dtype))
    y, h = _layers().rms_norm(x, w, 1e-6, residual=res, tuning=tune)
    want_y, want_h = ref.rms_norm(x, w, 1e-6, residual=res)
    assert torch.equal(h, (x.float() + res.float()).to(dtype))  # h is rounded to x's dtype, exactly
    assert torch.equal(h, want_h)
    torch.testing.assert_close(y, want_y, **_tol(dtype))
    assert torch.equal(x, x0) and torch.equal(res, r0)  # inputs untouched


def test_rms_norm_strided_rows_and_leading_dims(tune):
    g = _gen(2)
    wide = torch.randn(3, 2 * 96, generator=g)
    x = wide[:, ::2]  # column-strided view
    w = torch.randn(96, generator=g)
    res = torch.randn(3, 96, generator=g)
    y, h = _layers().rms_norm(x, w, 1e-5, residual=res, tuning=tune)
    want_y, want_h = ref.rms_norm(x, w, 1e-5, residual=res)
    torch.testing.assert_close(y, want_y)
    assert torch.equal(h, want_h)
    x3 = torch.randn(2, 4, 7, 32, generator=g).transpose(1, 2)  # [2, 7, 4, 32], not collapsible to rows
    w3 = torch.randn(32, generator=g)
    y3 = _layers().rms_norm(x3, w3, 1e-6, residual=None, tuning=tune)
    assert y3.shape == x3.shape
    torch.testing.assert_close(y3, ref.rms_norm(x3, w3, 1e-6))


def test_rms_norm_long_rows_two_pass(monkeypatch, triton_backend):
    """Rows longer than one register tile take the streamed two-pass path."""
    layers = _layers()
    monkeypatch.setattr(layers, "MAX_ROW_BLOCK", 64)
    g = _gen(3)
    x = torch.randn(3, 150, generator=g).to(torch.bfloat16)
    res = torch.randn(3, 150, generator=g).to(torch.bfloat16)
    w = torch.randn(150, generator=g)
    y, h = layers.rms_norm(x, w, 1e-6, residual=res, tuning=triton_backend.tune)
    want_y, want_h = ref.rms_norm(x, w, 1e-6, residual=res)
    assert torch.equal(h, want_h)
    torch.testing.assert_close(y, want_y, **_tol(torch.bfloat16))
    y = layers.rms_norm(x, w, 1e-6, residual=None, tuning=triton_backend.tune)
    torch.testing.assert_close(y, ref.rms_norm(x, w, 1e-6), **_tol(torch.bfloat16))


def test_rms_norm_empty_and_errors(triton_backend):
    x, w = torch.empty(0, 64), torch.ones(64)
    y, h = triton_backend.rms_norm(x, w, 1e-6, residual=torch.empty(0, 64))
    assert y.shape == (0, 64) and h.shape == (0, 64)
    with pytest.raises(OpError, match="eps"):
        triton_backend.rms_norm(torch.randn(2, 64), w, 0.0)
    with pytest.raises(OpError, match="weight"):
        triton_backend.rms_norm(torch.randn(2, 64), torch.ones(32), 1e-6)
    with pytest.raises(OpError, match="residual"):
        triton_backend.rms_norm(torch.randn(2, 64), w, 1e-6, residual=torch.randn(2, 64).half())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "opts",
    [
        {"weight_offset": 1.0},
        {"weight_offset": 1.0, "residual": True},
        {"gate": "silu"},
        {"gate": "sigmoid", "weight_offset": -0.5},
    ],
)
def test_rms_norm_options(tune, dtype, opts):
    """Spec 1.2: the zero-centred weight (offset scalar) and the gated norm per head ([T, HV, V] rows)."""
    g = _gen(8)
    x = (3 * torch.randn(4, 6, 128, generator=g)).to(dtype)
    w = (0.2 * torch.randn(128, generator=g)).to(dtype)
    kw = {"weight_offset": opts.get("weight_offset", 0.0)}
    if opts.get("residual"):
        kw["residual"] = torch.randn(4, 6, 128, generator=g).to(dtype)
    if "gate" in opts:
        packed = torch.randn(4, 6, 2 * 128, generator=g).to(dtype)
        kw.update(gate=packed[..., 128:], gate_act=opts["gate"])  # a strided slice of a projection
    got = _layers().rms_norm(x, w, 1e-6, tuning=tune, **kw)
    want = ref.rms_norm(x, w, 1e-6, **kw)
    if "residual" in kw:
        assert torch.equal(got[1], want[1])
        got, want = got[0], want[0]
    assert got.shape == x.shape and got.dtype == dtype
    torch.testing.assert_close(got, want, **_tol(dtype))


def test_rms_norm_options_two_pass_and_errors(monkeypatch, triton_backend):
    layers = _layers()
    monkeypatch.setattr(layers, "MAX_ROW_BLOCK", 64)
    g = _gen(9)
    x, z = torch.randn(3, 150, generator=g).to(torch.bfloat16), torch.randn(3, 150, generator=g).to(torch.bfloat16)
    w = (0.1 * torch.randn(150, generator=g)).to(torch.bfloat16)
    for kw in ({"weight_offset": 1.0}, {"gate": z, "gate_act": "silu"}, {"gate": z, "gate_act": "sigmoid"}):
        got = layers.rms_norm(x, w, 1e-6, tuning=triton_backend.tune, **kw)
        torch.testing.assert_close(got, ref.rms_norm(x, w, 1e-6, **kw), **_tol(torch.bfloat16))
    assert layers.rms_norm(
        torch.empty(0, 8, 64), torch.ones(64), 1e-6, gate=torch.empty(0, 8, 64), tuning=triton_backend.tune
    ).shape == (0, 8, 64)
    with pytest.raises(OpError, match="'gate'.*residual"):
        layers.rms_norm(x, w, 1e-6, residual=x, gate=z, tuning=triton_backend.tune)
    with pytest.raises(OpError, match="gate_act"):
        layers.rms_norm(x, w, 1e-6, gate=z, gate_act="tanh", tuning=triton_backend.tune)


# ----------------------------------------------------------------------------- layer_norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("params", ["x-dtype", "float32", "no-bias"])
def test_layer_norm_matches_reference_and_float64(tune, dtype, params):
    g = _gen(7)
    x = (3 + 2 * torch.randn(2, 3, 128, generator=g)).to(dtype)  # a large mean: the variance is about it
    w = torch.randn(128, generator=g).to(torch.float32 if params == "float32" else dtype)
    b = None if params == "no-bias" else torch.randn(128, generator=g).to(w.dtype)
    y = _layers().layer_norm(x, w, b, 1e-6, tuning=tune)
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y, ref.layer_norm(x, w, b, 1e-6), **_tol(dtype))
    x64 = x.double()
    exact = torch.nn.functional.layer_norm(x64, (128,), w.double(), None if b is None else b.double(), 1e-6)
    torch.testing.assert_close(y.double(), exact, **_tol(dtype))


def test_layer_norm_long_strided_rows_and_errors(monkeypatch, triton_backend):
    """Rows longer than one register tile stream three passes; a column-strided x is read in place."""
    layers = _layers()
    monkeypatch.setattr(layers, "MAX_ROW_BLOCK", 64)
    g = _gen(8)
    x = torch.randn(5, 2 * 150, generator=g)[:, ::2]
    w, b = torch.randn(150, generator=g), torch.randn(150, generator=g)
    y = layers.layer_norm(x, w, b, 1e-5, tuning=triton_backend.tune)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (150,), w, b, 1e-5), rtol=1e-5, atol=1e-5)
    assert triton_backend.layer_norm(torch.empty(0, 8), torch.ones(8), None, 1e-6).shape == (0, 8)
    with pytest.raises(OpError, match="eps"):
        triton_backend.layer_norm(torch.randn(2, 8), torch.ones(8), None, 0.0)
    with pytest.raises(OpError, match="bias"):
        triton_backend.layer_norm(torch.randn(2, 8).half(), torch.ones(8).half(), torch.ones(8).double(), 1e-6)


# ----------------------------------------------------------------------------- rotary_embedding


def _cos_sin(max_pos: int, rot: int) -> torch.Tensor:
    inv = 1.0 / 10000.0 ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat([ang.cos(), ang.sin()], dim=-1).float()


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rot", [32, 16])  # 16 < D = 32: partial rotary
def test_rotary_matches_reference(tune, is_neox, rot):
    g = _gen(4)
    t, hq, hk, d = 5, 6, 2, 32
    q = torch.randn(t, hq, d, generator=g).to(torch.bfloat16)
    k = torch.randn(t, hk, d, generator=g).to(torch.bfloat16)
    cache = _cos_sin(64, rot)
    pos = torch.randint(0, 64, (t,), generator=g)
    q0, k0 = q.clone(), k.clone()
    got_q, got_k = _layers().rotary_embedding(pos, q, k, cache, is_neox=is_neox, tuning=tune)
    want_q, want_k = ref.rotary_embedding(pos, q, k, cache, is_neox=is_neox)
    assert got_q.dtype == q.dtype and got_k.shape == k.shape
    torch.testing.assert_close(got_q, want_q, **_tol(torch.bfloat16))
    torch.testing.assert_close(got_k, want_k, **_tol(torch.bfloat16))
    if rot < d:
        assert torch.equal(got_q[..., rot:], q[..., rot:]) and torch.equal(got_k[..., rot:], k[..., rot:])
    assert torch.equal(q, q0) and torch.equal(k, k0)  # new tensors; inputs untouched


def test_rotary_fp32_strided_inputs(tune):
    """q and k slices of one packed qkv projection; an fp32 cache stored transposed."""
    g = _gen(5)
    t, hq, hk, d, rot = 4, 4, 1, 24, 16
    qkv = torch.randn(t, hq + 2 * hk, d, generator=g)
    q, k, _ = qkv.split([hq, hk, hk], dim=1)
    cache = _cos_sin(10, rot).t().contiguous().t()
    pos = torch.tensor([0, 9, 3, 3])
    got_q, got_k = _layers().rotary_embedding(pos, q, k, cache, is_neox=False, tuning=tune)
    want_q, want_k = ref.rotary_embedding(pos, q, k, cache, is_neox=False)
    torch.testing.assert_close(got_q, want_q)
    torch.testing.assert_close(got_k, want_k)
    assert torch.equal(got_q[0], q[0])  # position 0: the identity


def test_rotary_empty_and_errors(triton_backend, validated_ops):
    cache = _cos_sin(8, 16)
    q, k = torch.empty(0, 2, 16), torch.empty(0, 1, 16)
    got_q, got_k = triton_backend.rotary_embedding(torch.empty(0, dtype=torch.int64), q, k, cache)
    assert got_q.shape == q.shape and got_k.shape == k.shape
    q, k = torch.randn(2, 2, 16), torch.randn(2, 1, 16)
    with pytest.raises(OpError, match=r"rotary_embedding: argument 'positions': expected positions in \[0, 8\)"):
        validated_ops.rotary_embedding(torch.tensor([0, 8]), q, k, cache)
    with pytest.raises(OpError, match="positions"):
        triton_backend.rotary_embedding(torch.tensor([0, 1], dtype=torch.int32), q, k, cache)
    with pytest.raises(OpError, match="cos_sin_cache"):
        triton_backend.rotary_embedding(torch.tensor([0, 1]), q, k, _cos_sin(8, 32))


# ----------------------------------------------------------------------------- silu_and_mul


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_and_mul(tune, dtype):
    g = _gen(6)
    x = (3 * torch.randn(9, 2 * 70, generator=g)).to(dtype)
    x[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -20.0]).to(dtype)  # saturating sigmoid
    y = _layers().silu_and_mul(x, tuning=tune)
    assert y.shape == (9, 70) and y.dtype == dtype
    torch.testing.assert_close(y, ref.silu_and_mul(x), **_tol(dtype))


def test_silu_and_mul_views_leading_dims_empty(triton_backend):
    g = _gen(7)
    x = torch.randn(2, 3, 2 * 2 * 40, generator=g)[..., ::2]  # [2, 3, 80] with element stride 2
    y = triton_backend.silu_and_mul(x)
    assert y.shape == (2, 3, 40)
    torch.testing.assert_close(y, ref.silu_and_mul(x))
    assert triton_backend.silu_and_mul(torch.empty(0, 64)).shape == (0, 32)
    with pytest.raises(OpError, match="even"):
        triton_backend.silu_and_mul(torch.randn(2, 7))
