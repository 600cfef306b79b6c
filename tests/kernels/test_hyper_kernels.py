"""The Triton hyper-connection kernels (hc_pre, hc_post, hc_head) against the reference, through Triton's
interpreter on CPU tensors: small shapes, both tilings (the interpreter's and a GPU's portable defaults)."""

from __future__ import annotations

import pytest
import torch

from hetero.errors import OpError
from hetero_cpu_ref import hyper as ref


@pytest.fixture(params=["interpreter", "gpu-tiles"])
def tune(request, triton_backend):
    from hetero.kernels.tuning import Tuning, TuningTable

    if request.param == "interpreter":
        return triton_backend.tune
    return Tuning(TuningTable(vendor="portable"), "generic", interpreted=False)


def _hyper():
    from hetero.kernels import hyper

    return hyper


def _tol(dtype: torch.dtype) -> dict:
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1e-2}


def _streams(g, t, n, d, dtype, strided=False):
    s = torch.randn(t, n, 2 * d if strided else d, generator=g) * torch.empty(t, 1, 1).uniform_(0.5, 8, generator=g)
    return s.to(dtype)[:, :, d:] if strided else s.to(dtype)


def _params(g, rows, n, d, entries):
    fn = torch.randn(rows, n * d, generator=g) * (n * d) ** -0.5
    return fn, torch.empty(entries).uniform_(0.5, 2.0, generator=g), 0.5 * torch.randn(rows, generator=g)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("iters", [0, 1, 3])
def test_hc_pre_matches_reference(tune, dtype, iters):
    g = torch.Generator().manual_seed(iters)
    n, d = 4, 200  # a non-power-of-two hidden size: the last D tile and the last K tile are partial
    rows, entries = (n * (n + 2), 3) if iters else (2 * n, 2)
    s = _streams(g, 6, n, d, dtype, strided=iters == 1)
    fn, scale, base = _params(g, rows, n, d, entries)
    s0 = s.clone()
    kw = {"norm_eps": 1e-6, "hc_eps": 0.05, "post_mult": 1.5, "post_eps": 0.05, "sinkhorn_iters": iters}
    got = _hyper().hc_pre(s, fn, scale, base, **kw, tuning=tune)
    want = ref.hc_pre(s, fn, scale, base, **kw)
    assert len(got) == len(want) == (3 if iters else 2)
    torch.testing.assert_close(got[0], want[0], **_tol(dtype))
    for g_, w_ in zip(got[1:], want[1:]):
        assert g_.dtype == torch.float32
        torch.testing.assert_close(g_, w_, rtol=1e-5, atol=1e-5)
    assert torch.equal(s, s0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_comb", [False, True])
def test_hc_post_matches_reference(tune, dtype, with_comb):
    g = torch.Generator().manual_seed(7)
    t, n, d = 5, 4, 200
    y, s = torch.randn(t, d, generator=g).to(dtype), _streams(g, t, n, d, dtype, strided=with_comb)
    post = 2 * torch.sigmoid(torch.randn(t, n, generator=g))
    comb = torch.softmax(1.5 * torch.randn(t, n, n, generator=g), -1) if with_comb else None
    got = _hyper().hc_post(y, s, post, comb, tuning=tune)
    torch.testing.assert_close(got, ref.hc_post(y, s, post, comb), **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hc_head_matches_reference(tune, dtype):
    g = torch.Generator().manual_seed(3)
    n, d = 4, 64
    s = _streams(g, 9, n, d, dtype)
    fn, scale, base = _params(g, n, n, d, 1)
    got = _hyper().hc_head(s, fn, scale, base, norm_eps=1e-6, hc_eps=0.05, tuning=tune)
    torch.testing.assert_close(got, ref.hc_head(s, fn, scale, base, norm_eps=1e-6, hc_eps=0.05), **_tol(dtype))


def test_empty_float64_and_errors(triton_backend):
    """T = 0 launches nothing; float64 (the oracle's dtype) stays float64; a bad call is an OpError."""
    g = torch.Generator().manual_seed(1)
    n, d = 2, 8
    fn, scale, base = _params(g, n * (n + 2), n, d, 3)
    x, post, comb = triton_backend.hc_pre(
        torch.empty(0, n, d), fn, scale, base, norm_eps=1e-6, hc_eps=1e-6, sinkhorn_iters=20
    )
    assert x.shape == (0, d) and post.shape == (0, n) and comb.shape == (0, n, n)
    s = _streams(g, 3, n, d, torch.float64)
    got = triton_backend.hc_pre(
        s, fn.double(), scale.double(), base.double(), norm_eps=1e-6, hc_eps=0.0, sinkhorn_iters=2
    )
    want = ref.hc_pre(s, fn.double(), scale.double(), base.double(), norm_eps=1e-6, hc_eps=0.0, sinkhorn_iters=2)
    assert all(t.dtype == torch.float64 for t in got)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    with pytest.raises(OpError, match="fn"):
        triton_backend.hc_pre(s, fn[: 2 * n], scale, base, norm_eps=1e-6, hc_eps=1e-6, sinkhorn_iters=1)
    with pytest.raises(OpError, match="comb"):
        triton_backend.hc_post(s[:, 0], s, torch.ones(3, n), torch.ones(3, n, n + 1))
