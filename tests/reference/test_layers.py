"""The reference glue ops (rms_norm, layer_norm, rotary_embedding, silu_and_mul) against independent formulations.

The independent sides: Hugging Face transformers' own model code (Qwen3RMSNorm,
the Llama/Qwen rotate_half rope, DeepSeek-V3's interleaved rope) and explicit
float64 formulas written out element by element here.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from hetero.errors import OpError
from hetero.spec import layers as spec_layers
from hetero_cpu_ref import layers

hf_qwen3 = pytest.importorskip("transformers.models.qwen3.modeling_qwen3")
try:
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf_dsv3
except ImportError:  # older transformers
    hf_dsv3 = None

LOW = [torch.bfloat16, torch.float16]
# One rounding of a value near 1 in bf16 / fp16, with some headroom for the float32 math.
LOW_TOL = {torch.bfloat16: dict(rtol=1e-2, atol=1e-2), torch.float16: dict(rtol=2e-3, atol=2e-3)}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(g: torch.Generator, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


# --------------------------------------------------------------------------- signatures


@pytest.mark.parametrize("name", ["rms_norm", "layer_norm", "rotary_embedding", "silu_and_mul"])
def test_signature_matches_spec(name):
    spec = getattr(spec_layers, name).__hetero_op__
    assert spec.check_signature(getattr(layers, name)) is None


# --------------------------------------------------------------------------- rms_norm


def rms_norm_f64(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Per row: x_j / sqrt(sum(x^2)/H + eps) * w_j, in float64."""
    x, w = x.double(), w.double()
    ms = (x * x).sum(-1, keepdim=True) / x.shape[-1]
    return x / torch.sqrt(ms + eps) * w


def hf_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    mod = hf_qwen3.Qwen3RMSNorm(w.shape[0], eps=eps).to(w.dtype)
    with torch.no_grad():
        mod.weight.copy_(w)
        return mod(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(7, 64), (2, 3, 48), (1, 1)])
def test_rms_norm_matches_hf_qwen3(dtype, shape):
    g = gen(1)
    x = randn(g, *shape, dtype=dtype) * 3
    w = 1 + 0.5 * randn(g, shape[-1], dtype=dtype)
    eps = 1e-6
    y = layers.rms_norm(x, w, eps)
    assert y.dtype == dtype and y.shape == x.shape
    # Qwen3RMSNorm always normalizes in float32, even for float64 input.
    torch.testing.assert_close(y, hf_rms_norm(x, w, eps), rtol=1e-5, atol=1e-5)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(y, rms_norm_f64(x, w, eps).to(dtype), **tol)


def test_rms_norm_eps_matters():
    x = torch.full((2, 4), 1e-3, dtype=torch.float64)
    w = torch.ones(4, dtype=torch.float64)
    for eps in (1e-6, 1e-2, 1):  # an int eps is a number too
        torch.testing.assert_close(layers.rms_norm(x, w, eps), rms_norm_f64(x, w, eps), rtol=1e-12, atol=0)


@pytest.mark.parametrize("dtype", LOW)
def test_rms_norm_low_precision(dtype):
    g = gen(2)
    x = randn(g, 9, 128, dtype=dtype)
    w = (1 + 0.5 * randn(g, 128)).to(dtype)
    y = layers.rms_norm(x, w, 1e-5)
    assert y.dtype == dtype
    torch.testing.assert_close(y.double(), rms_norm_f64(x, w, 1e-5), **LOW_TOL[dtype])
    # HF rounds twice (before and after the weight), so only close, not equal.
    torch.testing.assert_close(y, hf_rms_norm(x, w, 1e-5), **LOW_TOL[dtype])
    # A float32 weight with low-precision activations still returns x's dtype.
    y32w = layers.rms_norm(x, w.float(), 1e-5)
    assert y32w.dtype == dtype
    torch.testing.assert_close(y32w, y, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_rms_norm_fused_residual(dtype):
    g = gen(3)
    x = randn(g, 5, 32, dtype=dtype)
    res = randn(g, 5, 32, dtype=dtype)
    w = (1 + 0.5 * randn(g, 32)).to(dtype)
    x0, res0 = x.clone(), res.clone()
    y, h = layers.rms_norm(x, w, 1e-6, residual=res)
    assert y.dtype == dtype and h.dtype == dtype
    # h is the sum rounded once to x's dtype; y is exactly the unfused norm of h.
    torch.testing.assert_close(h, (x.double() + res.double()).to(dtype), rtol=0, atol=0)
    torch.testing.assert_close(y, layers.rms_norm(h, w, 1e-6), rtol=0, atol=0)
    torch.testing.assert_close(
        y.double(), rms_norm_f64(h, w, 1e-6), **({} if dtype in (torch.float32, torch.float64) else LOW_TOL[dtype])
    )
    # Inputs untouched, outputs are new tensors.
    assert torch.equal(x, x0) and torch.equal(res, res0)
    assert h.data_ptr() not in (x.data_ptr(), res.data_ptr())


# --------------------------------------------------------------------------- rotary_embedding


def make_rope(max_pos: int, rot: int, base: float = 10000.0):
    """(inv_freq, angles [P, rot/2]) in float64."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    angles = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv_freq)
    return inv_freq, angles


def vllm_cache(angles: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The spec layout: [P, rot] = cat(cos, sin) of the per-pair angles."""
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(dtype)


def hf_cos_sin(angles: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype):
    """HF convention: emb = cat(freqs, freqs); cos/sin [T, rot]."""
    emb = torch.cat([angles, angles], dim=-1)[positions]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rope_pairs_f64(
    x: torch.Tensor, positions: torch.Tensor, angles: torch.Tensor, rot: int, neox: bool
) -> torch.Tensor:
    """Pair-by-pair rotation written out explicitly, float64."""
    out = x.double().clone()
    src = x.double()
    half = rot // 2
    for i in range(half):
        a, b = (i, i + half) if neox else (2 * i, 2 * i + 1)
        th = angles[positions, i].view(-1, 1)  # [T, 1] broadcast over heads
        c, s = torch.cos(th), torch.sin(th)
        out[:, :, a] = src[:, :, a] * c - src[:, :, b] * s
        out[:, :, b] = src[:, :, b] * c + src[:, :, a] * s
    return out


def rope_inputs(seed: int, T=6, Hq=4, Hkv=2, D=32, P=50, dtype=torch.float32):
    g = gen(seed)
    q = randn(g, T, Hq, D, dtype=dtype)
    k = randn(g, T, Hkv, D, dtype=dtype)
    positions = torch.randint(0, P, (T,), generator=g, dtype=torch.int64)
    positions[0] = P - 1  # the last cache row is usable
    positions[1] = positions[2]  # repeats are fine
    return positions, q, k


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rotary_neox_matches_hf(dtype):
    P, D = 64, 32
    positions, q, k = rope_inputs(10, D=D, P=P, dtype=dtype)
    _, angles = make_rope(P, D)
    q2, k2 = layers.rotary_embedding(positions, q, k, vllm_cache(angles, dtype), is_neox=True)
    cos, sin = hf_cos_sin(angles, positions, dtype)
    hq, hk = hf_qwen3.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)  # [T, H, D] layout
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(q2, hq, **tol)
    torch.testing.assert_close(k2, hk, **tol)
    torch.testing.assert_close(q2.double(), rope_pairs_f64(q, positions, angles, D, True), **tol)
    torch.testing.assert_close(k2.double(), rope_pairs_f64(k, positions, angles, D, True), **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rotary_interleaved_matches_pair_formula(dtype):
    P, D = 40, 16
    positions, q, k = rope_inputs(11, D=D, P=P, dtype=dtype)
    _, angles = make_rope(P, D)
    q2, k2 = layers.rotary_embedding(positions, q, k, vllm_cache(angles, dtype), is_neox=False)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(q2.double(), rope_pairs_f64(q, positions, angles, D, False), **tol)
    torch.testing.assert_close(k2.double(), rope_pairs_f64(k, positions, angles, D, False), **tol)


@pytest.mark.skipif(
    hf_dsv3 is None or not hasattr(hf_dsv3, "apply_rotary_pos_emb_interleave"),
    reason="this transformers has no DeepSeek-V3 interleaved rope",
)
def test_rotary_interleaved_matches_hf_deepseek_v3():
    # DeepSeek-V3 ropes a 64-dim part per head; HF returns the rotated pairs
    # de-interleaved (evens then odds), which is a fixed permutation of the
    # in-place layout the spec keeps.
    P, R = 128, 64
    positions, q, k = rope_inputs(12, T=5, Hq=3, Hkv=1, D=R, P=P, dtype=torch.float64)
    _, angles = make_rope(P, R)
    q2, k2 = layers.rotary_embedding(positions, q, k, vllm_cache(angles, torch.float64), is_neox=False)
    cos, sin = hf_cos_sin(angles, positions, torch.float64)
    hq, hk = hf_dsv3.apply_rotary_pos_emb_interleave(q, k, cos, sin, unsqueeze_dim=1)
    deinterleave = torch.cat([torch.arange(0, R, 2), torch.arange(1, R, 2)])
    torch.testing.assert_close(q2[..., deinterleave], hq, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(k2[..., deinterleave], hk, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("is_neox", [True, False])
def test_rotary_partial(is_neox):
    P, D, rot = 30, 48, 16
    positions, q, k = rope_inputs(13, D=D, P=P, dtype=torch.float64)
    _, angles = make_rope(P, rot)
    q2, k2 = layers.rotary_embedding(positions, q, k, vllm_cache(angles, torch.float64), is_neox=is_neox)
    # Dims past rot pass through bit for bit.
    assert torch.equal(q2[..., rot:], q[..., rot:]) and torch.equal(k2[..., rot:], k[..., rot:])
    torch.testing.assert_close(q2, rope_pairs_f64(q, positions, angles, rot, is_neox), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(k2, rope_pairs_f64(k, positions, angles, rot, is_neox), rtol=1e-12, atol=1e-12)
    if is_neox:  # HF partial rotary (e.g. GLM / Phi): rope the first rot dims, concatenate the rest.
        cos, sin = hf_cos_sin(angles, positions, torch.float64)
        hq, hk = hf_qwen3.apply_rotary_pos_emb(q[..., :rot], k[..., :rot], cos, sin, unsqueeze_dim=1)
        torch.testing.assert_close(q2[..., :rot], hq, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(k2[..., :rot], hk, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("cache_in_q_dtype", [False, True])
@pytest.mark.parametrize("is_neox", [True, False])
def test_rotary_low_precision(dtype, cache_in_q_dtype, is_neox):
    P, D = 64, 32
    positions, q, k = rope_inputs(14, D=D, P=P, dtype=dtype)
    _, angles = make_rope(P, D)
    cache = vllm_cache(angles, dtype if cache_in_q_dtype else torch.float32)
    q2, k2 = layers.rotary_embedding(positions, q, k, cache, is_neox=is_neox)
    assert q2.dtype == dtype and k2.dtype == dtype
    ref_q = rope_pairs_f64(q, positions, angles, D, is_neox)
    ref_k = rope_pairs_f64(k, positions, angles, D, is_neox)
    tol = {torch.bfloat16: dict(rtol=2e-2, atol=2e-2), torch.float16: dict(rtol=4e-3, atol=4e-3)}[dtype]
    torch.testing.assert_close(q2.double(), ref_q, **tol)
    torch.testing.assert_close(k2.double(), ref_k, **tol)


def test_rotary_returns_new_tensors_and_leaves_inputs():
    P, D = 20, 16
    positions, q, k = rope_inputs(15, D=D, P=P, dtype=torch.float64)
    _, angles = make_rope(P, D)
    cache = vllm_cache(angles, torch.float64)
    before = [t.clone() for t in (positions, q, k, cache)]
    q2, k2 = layers.rotary_embedding(positions, q, k, cache)
    for t, t0 in zip((positions, q, k, cache), before):
        assert torch.equal(t, t0)
    assert q2.data_ptr() != q.data_ptr() and k2.data_ptr() != k.data_ptr()
    assert q2.shape == q.shape and k2.shape == k.shape


def test_rotary_position_zero_is_identity_and_empty_batch():
    P, D = 8, 16
    _, angles = make_rope(P, D)
    cache = vllm_cache(angles)
    g = gen(16)
    q, k = randn(g, 3, 2, D), randn(g, 3, 1, D)
    for neox in (True, False):
        q2, k2 = layers.rotary_embedding(torch.zeros(3, dtype=torch.int64), q, k, cache, is_neox=neox)
        assert torch.equal(q2, q) and torch.equal(k2, k)
    q0, k0 = layers.rotary_embedding(torch.zeros(0, dtype=torch.int64), q[:0], k[:0], cache)
    assert q0.shape == (0, 2, D) and k0.shape == (0, 1, D)


# --------------------------------------------------------------------------- silu_and_mul


@pytest.mark.parametrize("shape", [(5, 24), (2, 3, 10), (4, 2)])
def test_silu_and_mul_float64(shape):
    x = randn(gen(20), *shape, dtype=torch.float64) * 4
    half = shape[-1] // 2
    want = F.silu(x[..., :half]) * x[..., half:]
    got = layers.silu_and_mul(x)
    assert got.shape == (*shape[:-1], half) and got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)
    # and the formula written out: g / (1 + exp(-g)) * u
    g, u = x[..., :half], x[..., half:]
    torch.testing.assert_close(got, g / (1 + torch.exp(-g)) * u, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, *LOW])
def test_silu_and_mul_lower_precision(dtype):
    x = randn(gen(21), 7, 64, dtype=dtype) * 3
    got = layers.silu_and_mul(x)
    assert got.dtype == dtype and got.shape == (7, 32)
    x64 = x.double()
    want = F.silu(x64[..., :32]) * x64[..., 32:]
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else LOW_TOL[dtype]
    torch.testing.assert_close(got.double(), want, **tol)


def test_silu_and_mul_leaves_input():
    x = randn(gen(22), 3, 8)
    x0 = x.clone()
    layers.silu_and_mul(x)
    assert torch.equal(x, x0)


# --------------------------------------------------------------------------- bad inputs


def _rope_ok(P=10, D=16, rot=16, T=3):
    g = gen(30)
    _, angles = make_rope(P, rot)
    return dict(
        positions=torch.tensor([0, 1, P - 1][:T], dtype=torch.int64),
        q=randn(g, T, 4, D),
        k=randn(g, T, 2, D),
        cos_sin_cache=vllm_cache(angles),
    )


def _rope(**over):
    args = _rope_ok()
    is_neox = over.pop("is_neox", True)
    args.update(over)
    return lambda: layers.rotary_embedding(
        args["positions"], args["q"], args["k"], args["cos_sin_cache"], is_neox=is_neox
    )


_X = torch.randn(4, 8, generator=gen(31))
_W = torch.ones(8)
_META = torch.device("meta")

BAD = {
    # rms_norm
    "rms x not tensor": (lambda: layers.rms_norm([[1.0]], _W, 1e-6), "rms_norm", "x"),
    "rms x int": (lambda: layers.rms_norm(_X.long(), _W, 1e-6), "rms_norm", "x"),
    "rms x 0-d": (lambda: layers.rms_norm(torch.tensor(1.0), torch.ones(1), 1e-6), "rms_norm", "x"),
    "rms weight shape": (lambda: layers.rms_norm(_X, torch.ones(7), 1e-6), "rms_norm", "weight"),
    "rms weight 2-d": (lambda: layers.rms_norm(_X, torch.ones(1, 8), 1e-6), "rms_norm", "weight"),
    "rms weight int": (lambda: layers.rms_norm(_X, torch.ones(8, dtype=torch.int32), 1e-6), "rms_norm", "weight"),
    "rms eps zero": (lambda: layers.rms_norm(_X, _W, 0.0), "rms_norm", "eps"),
    "rms eps negative": (lambda: layers.rms_norm(_X, _W, -1e-6), "rms_norm", "eps"),
    "rms eps nan": (lambda: layers.rms_norm(_X, _W, math.nan), "rms_norm", "eps"),
    "rms eps inf": (lambda: layers.rms_norm(_X, _W, math.inf), "rms_norm", "eps"),
    "rms eps str": (lambda: layers.rms_norm(_X, _W, "1e-6"), "rms_norm", "eps"),
    "rms eps None": (lambda: layers.rms_norm(_X, _W, None), "rms_norm", "eps"),
    "rms eps bool": (lambda: layers.rms_norm(_X, _W, True), "rms_norm", "eps"),
    "rms residual shape": (lambda: layers.rms_norm(_X, _W, 1e-6, residual=torch.zeros(4, 7)), "rms_norm", "residual"),
    "rms residual dtype": (
        lambda: layers.rms_norm(_X, _W, 1e-6, residual=torch.zeros(4, 8, dtype=torch.float64)),
        "rms_norm",
        "residual",
    ),
    "rms weight device": (lambda: layers.rms_norm(_X, torch.ones(8, device=_META), 1e-6), "rms_norm", "weight"),
    "rms residual device": (
        lambda: layers.rms_norm(_X, _W, 1e-6, residual=torch.zeros(4, 8, device=_META)),
        "rms_norm",
        "residual",
    ),
    # rotary_embedding
    "rope q 2-d": (_rope(q=torch.randn(3, 16)), "rotary_embedding", "q"),
    "rope q int": (_rope(q=torch.zeros(3, 4, 16, dtype=torch.int32)), "rotary_embedding", "q"),
    "rope k 4-d": (_rope(k=torch.randn(3, 2, 16, 1)), "rotary_embedding", "k"),
    "rope k tokens": (_rope(k=torch.randn(2, 2, 16)), "rotary_embedding", "k"),
    "rope k head dim": (_rope(k=torch.randn(3, 2, 8)), "rotary_embedding", "k"),
    "rope positions int32": (
        _rope(positions=torch.tensor([0, 1, 2], dtype=torch.int32)),
        "rotary_embedding",
        "positions",
    ),
    "rope positions float": (_rope(positions=torch.tensor([0.0, 1.0, 2.0])), "rotary_embedding", "positions"),
    "rope positions length": (
        _rope(positions=torch.tensor([0, 1], dtype=torch.int64)),
        "rotary_embedding",
        "positions",
    ),
    "rope positions 2-d": (_rope(positions=torch.zeros(3, 1, dtype=torch.int64)), "rotary_embedding", "positions"),
    "rope positions negative": (
        _rope(positions=torch.tensor([0, -1, 2], dtype=torch.int64)),
        "rotary_embedding",
        "positions",
    ),
    "rope positions past cache": (
        _rope(positions=torch.tensor([0, 10, 2], dtype=torch.int64)),
        "rotary_embedding",
        "positions",
    ),
    "rope cache int": (
        _rope(cos_sin_cache=torch.zeros(10, 16, dtype=torch.int64)),
        "rotary_embedding",
        "cos_sin_cache",
    ),
    "rope cache 1-d": (_rope(cos_sin_cache=torch.zeros(160)), "rotary_embedding", "cos_sin_cache"),
    "rope rot odd": (_rope(cos_sin_cache=torch.zeros(10, 7)), "rotary_embedding", "cos_sin_cache"),
    "rope rot > D": (_rope(cos_sin_cache=torch.zeros(10, 18)), "rotary_embedding", "cos_sin_cache"),
    "rope cache device": (_rope(cos_sin_cache=torch.zeros(10, 16, device=_META)), "rotary_embedding", "cos_sin_cache"),
    "rope k device": (_rope(k=torch.zeros(3, 2, 16, device=_META)), "rotary_embedding", "k"),
    "rope is_neox not bool": (_rope(is_neox="yes"), "rotary_embedding", "is_neox"),
    # silu_and_mul
    "silu odd": (lambda: layers.silu_and_mul(torch.zeros(3, 7)), "silu_and_mul", "x"),
    "silu int": (lambda: layers.silu_and_mul(torch.zeros(3, 8, dtype=torch.int64)), "silu_and_mul", "x"),
    "silu 0-d": (lambda: layers.silu_and_mul(torch.tensor(2.0)), "silu_and_mul", "x"),
    "silu not tensor": (lambda: layers.silu_and_mul(None), "silu_and_mul", "x"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_raises_op_error(case):
    call, op, arg = BAD[case]
    with pytest.raises(OpError) as info:
        call()
    err = info.value
    assert (err.op, err.arg) == (op, arg), str(err)
    msg = str(err)
    assert msg.startswith(f"{op}: argument '{arg}': expected ") and ", got " in msg
    assert err.expected and err.got is not None


# --------------------------------------------------------------------------- layer_norm (spec 1.3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(7, 128), (2, 3, 48), (1, 7168)])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_matches_torch(dtype, shape, bias):
    g = gen(11)
    x, w = randn(g, *shape, dtype=dtype) + 3.0, randn(g, shape[-1], dtype=dtype)
    b = randn(g, shape[-1], dtype=dtype) if bias else None
    want = F.layer_norm(x, (shape[-1],), w, b, 1e-6)
    torch.testing.assert_close(
        layers.layer_norm(x, w, b, 1e-6), want, atol=2e-6 if dtype == torch.float32 else 1e-12, rtol=0
    )


@pytest.mark.parametrize("dtype", LOW)
def test_layer_norm_low_precision_with_float32_params_rounds_once(dtype):
    """DeepSeek's indexer k_norm: bf16 keys, float32 weight and bias; float32 math, one rounding."""
    g = gen(12)
    x, w, b = randn(g, 9, 128, dtype=dtype), randn(g, 128), randn(g, 128)
    want = F.layer_norm(x.double(), (128,), w.double(), b.double(), 1e-6).to(dtype)
    got = layers.layer_norm(x, w, b, 1e-6)
    assert got.dtype == dtype
    assert (got.double() - want.double()).abs().max() <= (want.double().abs() * 2.0**-7).max()


def test_layer_norm_variance_is_biased_and_eps_inside_the_root():
    x = torch.tensor([[1.0, 3.0]], dtype=torch.float64)
    got = layers.layer_norm(x, torch.ones(2, dtype=torch.float64), None, 1.0)
    torch.testing.assert_close(got, torch.tensor([[-1.0, 1.0]], dtype=torch.float64) / 2**0.5)


@pytest.mark.parametrize(
    "args, arg",
    [
        ((torch.randn(3, 8), torch.randn(7), None, 1e-6), "weight"),
        ((torch.randn(3, 8, dtype=torch.bfloat16), torch.randn(8), torch.randn(8, dtype=torch.float16), 1e-6), "bias"),
        ((torch.randn(3, 8), torch.randn(8), None, 0.0), "eps"),
        ((torch.randn(3, 8, dtype=torch.bfloat16), torch.randn(8, dtype=torch.float64), None, 1e-6), "weight"),
    ],
)
def test_layer_norm_rejects_bad_arguments_by_name(args, arg):
    with pytest.raises(OpError) as info:
        layers.layer_norm(*args)
    assert info.value.arg == arg
