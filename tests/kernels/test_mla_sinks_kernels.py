"""mla_attention's sinks (spec 1.7) in the Triton kernels, dense and sparse, under the interpreter,
against the reference: sinks that take a real share of the softmax, one above every logit (the
output's rescale), +-20, a strided sinks view, rows that see no key (out 0, lse -inf), and more
heads than one sparse program's block (BLOCK_H 16 with 20 heads: the second block's sinks)."""

from __future__ import annotations

import pytest
import torch

from hetero.kernels.tuning import Tuning, TuningTable
from hetero.spec import AttentionMeta
from hetero_cpu_ref import attention as ref

SMALL = {"mla_attention": {"BLOCK_M": 16, "BLOCK_N": 16}, "mla_sparse": {"BLOCK_H": 16, "BLOCK_N": 16}}
H, LKV, R, BS, NB = 20, 48, 16, 4, 16


@pytest.fixture(params=["interpreter", "small-tiles"])
def tune(request, triton_backend):
    if request.param == "interpreter":
        return triton_backend.tune
    return Tuning(TuningTable(vendor="test", archs={"small": SMALL}), "small", interpreted=True)


def _inputs(dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    meta = AttentionMeta.build([5, 1, 3], [12, 7, 3], torch.randperm(NB, generator=g)[:12].reshape(3, 4))
    t = 9
    qn, qp = torch.randn(t, H, LKV, generator=g).to(dtype), torch.randn(t, H, R, generator=g).to(dtype)
    ckv, kpe = torch.randn(NB, BS, LKV, generator=g).to(dtype), torch.randn(NB, BS, R, generator=g).to(dtype)
    idx = torch.full((t, 6), -1, dtype=torch.int32)
    for i, pos in enumerate([7, 8, 9, 10, 11, 6, 0, 1, 2]):
        keep = min(4, pos + 1)
        idx[i, :keep] = torch.randperm(pos + 1, generator=g)[:keep]
    idx[3] = -1  # a row that sees no key: out 0 and lse -inf, its sink notwithstanding
    return (qn, qp, ckv, kpe, meta), idx


def _sinks(kind: str) -> torch.Tensor:
    if kind == "share":  # around the rows' lse, and head 19 (second sparse head block) far above it
        return torch.cat([torch.linspace(-1.0, 4.0, H - 1), torch.tensor([9.0])])
    if kind == "pm20":
        return 20.0 * (1.0 - 2.0 * (torch.arange(H) % 2)).float()
    return torch.linspace(-2.0, 6.0, 2 * H)[::2]  # "strided": a view with stride 2


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("kind", ["share", "pm20", "strided"])
def test_mla_sinks_match_reference(tune, sparse, kind):
    from hetero.kernels import attention

    args, idx = _inputs(torch.float32)
    sinks = _sinks(kind)
    opts = dict(scale=0.17, return_lse=True, topk_indices=idx if sparse else None, sinks=sinks)
    out, lse = attention.mla_attention(*args, **opts, tuning=tune)
    want, want_lse = ref.mla_attention(*args, **opts)
    torch.testing.assert_close(out, want, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(lse, want_lse, rtol=2e-5, atol=2e-5)
    plain = ref.mla_attention(*args, scale=0.17, return_lse=True, topk_indices=opts["topk_indices"])
    assert torch.equal(want_lse, plain[1]) and not torch.allclose(want, plain[0])  # sinks: out only
    if sparse:
        assert (out[3] == 0).all() and torch.isneginf(lse[3]).all()


def test_mla_sinks_bf16_without_lse(tune):
    from hetero.kernels import attention

    args, idx = _inputs(torch.bfloat16, seed=1)
    for topk in (None, idx):
        got = attention.mla_attention(*args, scale=0.17, topk_indices=topk, sinks=_sinks("share"), tuning=tune)
        want = ref.mla_attention(*args, scale=0.17, topk_indices=topk, sinks=_sinks("share"))
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
