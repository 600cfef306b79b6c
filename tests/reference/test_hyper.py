"""The reference hyper-connection ops (spec 1.7) against the modules they come from: transformers'
DeepseekV4HyperConnection / DeepseekV4HyperHead / DeepseekV4DecoderLayer's mixing and HYV4HyperConnection."""

from __future__ import annotations

import types

import pytest
import torch

from hetero.spec import OPS
from hetero_cpu_ref import hyper as ref

T, N, D = 6, 4, 32


def _config(**kw) -> types.SimpleNamespace:
    base = {"hc_mult": N, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6, "hidden_size": D}
    return types.SimpleNamespace(**{**base, **kw})


def _fill(module: torch.nn.Module, gen: torch.Generator) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(
                torch.empty(p.shape).uniform_(0.5, 2.0, generator=gen)
                if "scale" in name
                else 0.3 * torch.randn(p.shape, generator=gen)
            )


def _streams(gen: torch.Generator) -> torch.Tensor:
    return 3 * torch.randn(T, N, D, generator=gen)


def test_deepseek_v4_connection_head_and_mixing():
    ds = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")
    gen = torch.Generator().manual_seed(0)
    hc, head = ds.DeepseekV4HyperConnection(_config()), ds.DeepseekV4HyperHead(_config())
    _fill(hc, gen), _fill(head, gen)
    s, y = _streams(gen), torch.randn(T, D, generator=gen)
    post, comb, collapsed = hc(s[None])
    x, p, c = ref.hc_pre(s, hc.fn.data, hc.scale.data, hc.base.data, norm_eps=1e-6, hc_eps=1e-6, sinkhorn_iters=20)
    for got, want in ((x, collapsed[0]), (p, post[0]), (c, comb[0])):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    mixed = post[0].unsqueeze(-1) * y.unsqueeze(-2) + torch.matmul(comb[0].transpose(-1, -2), s)  # the decoder layer
    torch.testing.assert_close(ref.hc_post(y, s, p, c), mixed, rtol=1e-5, atol=1e-5)
    want = head(s[None])[0]
    got = ref.hc_head(s, head.hc_fn.data, head.hc_scale.data, head.hc_base.data, norm_eps=1e-6, hc_eps=1e-6)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_hy4_connection_without_sinkhorn():
    hy = pytest.importorskip("transformers.models.hy_v4.modeling_hy_v4")
    gen = torch.Generator().manual_seed(1)
    hc = hy.HYV4HyperConnection(_config(hc_magnitude=1.5, rms_norm_eps=1e-5))
    _fill(hc, gen)
    s = _streams(gen)
    post, collapsed = hc(s[None])
    got = ref.hc_pre(
        s, hc.fn.data, hc.scale.data, hc.base.data, norm_eps=1e-5, hc_eps=1e-6, post_mult=1.5, post_eps=1e-6
    )
    assert len(got) == 2  # no comb without Sinkhorn: the spec's Output(when="sinkhorn_iters")
    torch.testing.assert_close(got[0], collapsed[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], post[0], rtol=1e-5, atol=1e-5)
    assert not OPS["hc_pre"].output("comb").present({"sinkhorn_iters": 0})
    assert OPS["hc_pre"].output("comb").present({"sinkhorn_iters": 1})


@pytest.mark.parametrize("op", ["hc_pre", "hc_post", "hc_head"])
def test_ascend_declines_with_a_reason(op):
    support = pytest.importorskip("hetero_ascend.support")
    for triton_ok in (False, True):
        why = support.reason(op, {"dtype": "bfloat16"}, triton_ok)
        assert why and "torch_npu" in why and "never run on an NPU" in why
