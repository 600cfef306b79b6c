"""The Triton cache kernels (write_kv, write_mla_kv, merge_attention) against the reference,
through Triton's interpreter on CPU tensors.

Each kernel runs twice where it matters: with the interpreter's tuning (big tiles, several
tokens or rows per program) and with the portable GPU defaults (one token per program),
so the tile shapes a GPU launches are checked too.
"""

from __future__ import annotations

import pytest
import torch

from hetero.errors import OpError
from hetero_cpu_ref import attention as ref

NEG_INF = float("-inf")


@pytest.fixture(params=["interpreter", "gpu-tiles"])
def tune(request, triton_backend):
    """The tuning a kernel wrapper receives: the interpreter's, or the portable defaults a GPU gets."""
    from hetero.kernels.tuning import Tuning, TuningTable

    if request.param == "interpreter":
        return triton_backend.tune
    return Tuning(TuningTable(vendor="portable"), "generic", interpreted=False)


def _cache_mod():
    from hetero.kernels import cache

    return cache


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------- write_kv


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_kv_skips_minus_one_and_matches_reference(tune, dtype):
    g = _gen(1)
    t, hkv, d, dv, nb, bs = 11, 3, 40, 24, 6, 4  # odd sizes: masks on every axis
    key = torch.randn(t, hkv, d, generator=g).to(dtype)
    value = torch.randn(t, hkv, dv, generator=g).to(dtype)
    k_cache = torch.randn(nb, bs, hkv, d, generator=g).to(dtype)
    v_cache = torch.randn(nb, bs, hkv, dv, generator=g).to(dtype)
    slots = torch.randperm(nb * bs, generator=g)[:t]
    slots[[0, 4, 10]] = -1
    want_k, want_v = k_cache.clone(), v_cache.clone()
    ref.write_kv(key, value, want_k, want_v, slots)
    out = _cache_mod().write_kv(key, value, k_cache, v_cache, slots, tuning=tune)
    assert out is None
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


def test_write_kv_strided_views(tune):
    """key/value slices of a packed qkv; caches the K and V halves of one [NB, 2, BS, H, D] tensor."""
    g = _gen(2)
    t, hq, hkv, d, nb, bs = 7, 4, 2, 16, 5, 3
    qkv = torch.randn(t, hq + 2 * hkv, d, generator=g)
    _, key, value = qkv.split([hq, hkv, hkv], dim=1)
    kv = torch.randn(nb, 2, bs, hkv, d, generator=g)
    want = kv.clone()
    slots = torch.tensor([3, -1, 0, 14, 7, -1, 9])
    ref.write_kv(key, value, want[:, 0], want[:, 1], slots)
    _cache_mod().write_kv(key, value, kv[:, 0], kv[:, 1], slots, tuning=tune)
    assert torch.equal(kv, want)  # written in place through the views, nothing else touched


def test_write_kv_all_skipped_and_empty(triton_backend):
    k_cache, v_cache = torch.randn(2, 4, 1, 8), torch.randn(2, 4, 1, 8)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    key = torch.randn(3, 1, 8)
    triton_backend.write_kv(key, key, k_cache, v_cache, torch.full((3,), -1, dtype=torch.int64))
    empty = torch.empty(0, 1, 8)
    triton_backend.write_kv(empty, empty, k_cache, v_cache, torch.empty(0, dtype=torch.int64))
    assert torch.equal(k_cache, before_k) and torch.equal(v_cache, before_v)


def test_write_kv_rejects_bad_arguments(triton_backend, validated_ops):
    key = torch.randn(2, 1, 8)
    k_cache = torch.randn(2, 4, 1, 8)
    with pytest.raises(OpError, match="slot_mapping"):
        triton_backend.write_kv(key, key, k_cache, k_cache.clone(), torch.tensor([0, 1], dtype=torch.int32))
    with pytest.raises(OpError, match=r"write_kv: argument 'slot_mapping': expected slots in \[-1, 8\)"):
        validated_ops.write_kv(key, key, k_cache, k_cache.clone(), torch.tensor([0, 8]))  # 8 = NB*BS
    before = k_cache.clone()
    triton_backend.write_kv(key, key, k_cache, k_cache.clone(), torch.tensor([8, 10**9]))  # unvalidated: skipped
    assert torch.equal(k_cache, before)
    with pytest.raises(OpError, match="k_cache"):
        triton_backend.write_kv(key, key, k_cache.half(), k_cache.clone(), torch.tensor([0, 1]))


# ----------------------------------------------------------------------------- write_mla_kv


@pytest.mark.parametrize("bs", [1, 16])
def test_write_mla_kv_views_and_skips(tune, bs):
    g = _gen(3)
    t, lkv, r, nb = 9, 96, 16, 4
    kv_c, k_pe = torch.randn(t, lkv + r, generator=g, dtype=torch.float32).to(torch.bfloat16).split([lkv, r], dim=1)
    nb = max(nb, t)  # bs 1 needs a block per token
    ckv = torch.randn(nb, bs, lkv, generator=g).to(torch.bfloat16)
    kpe = torch.randn(nb, bs, r, generator=g).to(torch.bfloat16)
    slots = torch.randperm(nb * bs, generator=g)[:t]
    slots[[1, 5]] = -1
    want_c, want_p = ckv.clone(), kpe.clone()
    ref.write_mla_kv(kv_c, k_pe, want_c, want_p, slots)
    assert _cache_mod().write_mla_kv(kv_c, k_pe, ckv, kpe, slots, tuning=tune) is None
    assert torch.equal(ckv, want_c) and torch.equal(kpe, want_p)


def test_write_mla_kv_empty(triton_backend):
    ckv, kpe = torch.randn(2, 4, 32), torch.randn(2, 4, 8)
    before = ckv.clone(), kpe.clone()
    triton_backend.write_mla_kv(torch.empty(0, 32), torch.empty(0, 8), ckv, kpe, torch.empty(0, dtype=torch.int64))
    assert torch.equal(ckv, before[0]) and torch.equal(kpe, before[1])


# ----------------------------------------------------------------------------- merge_attention


def _merge_inputs(t, h, dv, dtype, g, lo=-2.0, hi=12.0):
    out_a = torch.randn(t, h, dv, generator=g).to(dtype)
    out_b = torch.randn(t, h, dv, generator=g).to(dtype)
    lse_a = lo + (hi - lo) * torch.rand(t, h, generator=g)
    lse_b = lo + (hi - lo) * torch.rand(t, h, generator=g)
    u = torch.rand(t, h, generator=g)
    lse_a[(u < 0.2) | (u >= 0.85)] = NEG_INF
    lse_b[((u >= 0.2) & (u < 0.4)) | (u >= 0.85)] = NEG_INF
    lse_a[-1], lse_b[-1] = NEG_INF, NEG_INF  # a padding token: empty on both sides
    # the output of an empty side is garbage and must carry no weight
    out_a[lse_a == NEG_INF] = float("nan")
    out_b[lse_b == NEG_INF] = float("inf")
    return out_a, lse_a, out_b, lse_b


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merge_matches_reference_with_empty_sides_and_garbage(tune, dtype):
    g = _gen(4)
    out_a, lse_a, out_b, lse_b = _merge_inputs(6, 5, 48, dtype, g)
    want_out, want_lse = ref.merge_attention(out_a, lse_a, out_b, lse_b)
    out, lse = _cache_mod().merge_attention(out_a, lse_a, out_b, lse_b, tuning=tune)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert out.shape == out_a.shape and lse.shape == lse_a.shape
    assert torch.isfinite(out).all()
    both = (lse_a == NEG_INF) & (lse_b == NEG_INF)
    assert both.any() and (lse[both] == NEG_INF).all() and (out[both] == 0).all()
    assert torch.equal(torch.isfinite(lse), torch.isfinite(want_lse))
    fin = torch.isfinite(want_lse)
    torch.testing.assert_close(lse[fin], want_lse[fin], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(
        out, want_out, rtol=1e-5 if dtype == torch.float32 else 1.6e-2, atol=1e-5 if dtype == torch.float32 else 1e-2
    )


def test_merge_one_side_is_identity_and_large_lse(triton_backend):
    g = _gen(5)
    t, h, dv = 4, 3, 20
    out_a = torch.randn(t, h, dv, generator=g)
    out_b = torch.full((t, h, dv), float("nan"))
    lse_a = torch.tensor([[105.0, 110.0, -3.0]] * t)  # exp(110) overflows float32
    lse_b = torch.full((t, h), NEG_INF)
    out, lse = triton_backend.merge_attention(out_a, lse_a, out_b, lse_b)
    assert torch.equal(out, out_a) and torch.equal(lse, lse_a)
    # two equal large lse: half and half, lse + log 2
    out, lse = triton_backend.merge_attention(out_a, lse_a, 3 * out_a, lse_a)
    torch.testing.assert_close(out, 2 * out_a)
    torch.testing.assert_close(lse, lse_a + torch.log(torch.tensor(2.0)))


def test_merge_transposed_lse_views(tune):
    g = _gen(6)
    out_a, lse_a, out_b, lse_b = _merge_inputs(5, 4, 32, torch.float32, g)
    lse_a_v, lse_b_v = lse_a.t().contiguous().t(), lse_b.t().contiguous().t()  # [H, T] storage, [T, H] view
    assert not lse_a_v.is_contiguous()
    out_b_v = torch.stack([out_b, out_b], dim=3).flatten(2)[:, :, ::2]  # a strided out too
    assert not out_b_v.is_contiguous()
    want_out, want_lse = ref.merge_attention(out_a, lse_a, out_b, lse_b)
    out, lse = _cache_mod().merge_attention(out_a, lse_a_v, out_b_v, lse_b_v, tuning=tune)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(lse, want_lse)


def test_merge_empty_and_errors(triton_backend):
    out_a = torch.empty(0, 4, 8)
    lse = torch.empty(0, 4)
    out, l = triton_backend.merge_attention(out_a, lse, out_a, lse)
    assert out.shape == (0, 4, 8) and l.shape == (0, 4) and l.dtype == torch.float32
    x, s = torch.randn(2, 4, 8), torch.randn(2, 4)
    with pytest.raises(OpError, match="lse_b"):
        triton_backend.merge_attention(x, s, x, s.half())
    with pytest.raises(OpError, match="out_b"):
        triton_backend.merge_attention(x, s, x[:, :2], s)
