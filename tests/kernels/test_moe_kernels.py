"""The Triton MoE ops (route, moe_permute, moe_unpermute, fused_moe) against the CPU reference,
through Triton's interpreter. Small tiles, so that the counting sort spans several pair blocks
and expert slices, and expert groups span several GEMM tiles."""

from __future__ import annotations

import math

import pytest
import torch

from hetero.kernels import Tuning, TuningTable

cpu_ref = pytest.importorskip("hetero_cpu_ref.moe")


def small_tiles() -> Tuning:
    gemm = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 4}
    table = TuningTable(
        vendor="test",
        archs={
            "tiny": {
                "fused_moe": gemm,
                "grouped_gemm": gemm,
                "moe_permute": {"BLOCK_P": 16, "BLOCK_E": 4, "BLOCK_B": 2, "BLOCK_R": 8, "BLOCK_H": 16},
                "moe_unpermute": {"BLOCK_T": 4, "BLOCK_H": 16},
            }
        },
    )
    return Tuning(table, "tiny", interpreted=True)


def hot_ids(gen: torch.Generator, m: int, k: int, experts: list[int]) -> torch.Tensor:
    """k distinct experts per token, all drawn from ``experts`` (long runs of one expert: stability matters)."""
    pool = torch.tensor(experts)
    return pool[torch.rand(m, len(experts), generator=gen).argsort(dim=1)[:, :k]].to(torch.int32)


def test_moe_permute_is_a_stable_sort():
    from hetero.kernels import moe

    g = torch.Generator().manual_seed(0)
    x = torch.randn(37, 20, generator=g)
    ids = hot_ids(g, 37, 3, [1, 2, 5, 6, 9])  # 111 pairs in 7 blocks of 16; experts 0, 3, 4, 7, 8 and 10 empty
    got = moe.moe_permute(x, ids, 11, tuning=small_tiles())
    want = cpu_ref.moe_permute(x, ids, 11)
    for name, a, b in zip(("x_sorted", "group_ends", "perm"), got, want):
        assert a.dtype == b.dtype and torch.equal(a, b), name


def test_moe_permute_no_tokens(triton_backend):
    x_sorted, ends, perm = triton_backend.moe_permute(torch.randn(0, 8), torch.zeros(0, 2, dtype=torch.int32), 4)
    assert x_sorted.shape == (0, 8) and perm.shape == (0,) and perm.dtype == torch.int64
    assert torch.equal(ends, torch.zeros(4, dtype=torch.int32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moe_unpermute(dtype):
    from hetero.kernels import moe

    g = torch.Generator().manual_seed(1)
    ids = hot_ids(g, 13, 4, list(range(9)))
    perm = torch.sort(ids.reshape(-1).long(), stable=True).indices
    y = torch.randn(52, 24, generator=g).to(dtype)
    w = torch.rand(13, 4, generator=g)
    got = moe.moe_unpermute(y, perm, w, tuning=small_tiles())
    want = cpu_ref.moe_unpermute(y, perm, w)
    assert got.dtype == dtype
    torch.testing.assert_close(
        got, want, atol=1e-5 if dtype == torch.float32 else 1e-2, rtol=1e-5 if dtype == torch.float32 else 1e-2
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_moe_with_empty_experts(dtype):
    from hetero.kernels import moe

    g = torch.Generator().manual_seed(2)
    m, k, e, h, inter = 23, 2, 8, 40, 24
    x = torch.randn(m, h, generator=g).to(dtype)
    w13 = (torch.randn(e, 2 * inter, h, generator=g) / math.sqrt(h)).to(dtype)
    w2 = (torch.randn(e, h, inter, generator=g) / math.sqrt(inter)).to(dtype)
    ids = hot_ids(g, m, k, [1, 4, 5])  # experts 0, 2, 3, 6 and 7 empty; ~15 rows per used expert
    w = torch.rand(m, k, generator=g)
    got = moe.fused_moe(x, w13, w2, w, ids, tuning=small_tiles())
    want = cpu_ref.fused_moe(x, w13, w2, w, ids)
    exact = cpu_ref.fused_moe(x.double(), w13.double(), w2.double(), w.double(), ids)
    assert got.dtype == dtype and got.shape == (m, h)
    err, ref_err = (got.double() - exact).abs().max(), (want.double() - exact).abs().max()
    assert err <= 2 * ref_err + 1e-5 * exact.abs().max(), (float(err), float(ref_err))


def test_fused_moe_no_tokens(triton_backend):
    out = triton_backend.fused_moe(
        torch.randn(0, 8),
        torch.randn(3, 4, 8),
        torch.randn(3, 8, 2),
        torch.rand(0, 2),
        torch.zeros(0, 2, dtype=torch.int32),
    )
    assert out.shape == (0, 8)


def _clamped_experts(g: torch.Generator, dtype: torch.dtype, m=19, k=3, e=7, h=40, inter=24):
    """Inputs whose gate/up values often pass +-7 (gain 5 on unit-scale products), with biases."""
    x = torch.randn(m, h, generator=g).to(dtype)
    w13 = (torch.randn(e, 2 * inter, h, generator=g) * 5 / math.sqrt(h)).to(dtype)
    w2 = (torch.randn(e, h, inter, generator=g) / math.sqrt(inter)).to(dtype)
    b13, b2 = torch.randn(e, 2 * inter, generator=g).to(dtype), torch.randn(e, h, generator=g).to(dtype)
    return x, w13, w2, b13, b2, hot_ids(g, m, k, [0, 2, 3, 5, 6]), torch.rand(m, k, generator=g)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize(
    "act,limit,alpha",
    [("swigluoai", 7.0, 1.702), ("swigluoai", 3.0, 1.0), ("swiglu_clamp", 10.0, 1.702), ("silu", None, 1.702)],
)
@pytest.mark.parametrize("biases", ["none", "w13", "w2", "both"])
def test_fused_moe_activations_and_biases(dtype, act, limit, alpha, biases):
    """Each activation, with and without each expert bias, within twice the reference's own error
    of the float64 result (bf16: the same roundings, so equal here)."""
    from hetero.kernels import moe

    g = torch.Generator().manual_seed(5)
    x, w13, w2, b13, b2, ids, w = _clamped_experts(g, dtype)
    kw = dict(
        activation=act,
        alpha=alpha,
        limit=limit,
        w13_bias=b13 if biases in ("w13", "both") else None,
        w2_bias=b2 if biases in ("w2", "both") else None,
    )
    got = moe.fused_moe(x, w13, w2, w, ids, tuning=small_tiles(), **kw)
    want = cpu_ref.fused_moe(x, w13, w2, w, ids, **kw)
    wide = {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    exact = cpu_ref.fused_moe(x.double(), w13.double(), w2.double(), w.double(), ids, **wide)
    assert got.dtype == dtype and got.shape == x.shape
    err, ref_err = (got.double() - exact).abs().max(), (want.double() - exact).abs().max()
    assert err <= 2 * ref_err + 1e-5 * exact.abs().max(), (float(err), float(ref_err))


def test_fused_moe_biased_gpu_tiles_and_strided_bias():
    """The portable GPU tiles, swigluoai with non-contiguous biases (views of wider tensors)."""
    from hetero.kernels import moe

    g = torch.Generator().manual_seed(6)
    x, w13, w2, b13, b2, ids, w = _clamped_experts(g, torch.bfloat16, m=9, k=2, h=72, inter=40)
    b13 = torch.cat([b13, b13], dim=1)[:, ::2]
    b2 = torch.randn(b2.shape[1], b2.shape[0], generator=g).to(torch.bfloat16).T
    gpu = Tuning(TuningTable(vendor="portable"), "generic", interpreted=False)
    kw = dict(activation="swigluoai", alpha=1.702, limit=7.0, w13_bias=b13, w2_bias=b2)
    got = moe.fused_moe(x, w13, w2, w, ids, tuning=gpu, **kw)
    torch.testing.assert_close(got, cpu_ref.fused_moe(x, w13, w2, w, ids, **kw), atol=2e-2, rtol=2e-2)


def test_fused_moe_option_checks(triton_backend):
    from hetero import OpError

    x, w13, w2, w, ids = (
        torch.ones(3, 8),
        torch.ones(4, 6, 8),
        torch.ones(4, 8, 3),
        torch.ones(3, 2),
        torch.zeros(3, 2, dtype=torch.int32),
    )
    for arg, kw in [
        ("limit", dict(limit=7.0)),
        ("limit", dict(activation="swigluoai")),
        ("limit", dict(activation="swiglu_clamp", limit=0.0)),
        ("alpha", dict(activation="swigluoai", limit=7.0, alpha=float("nan"))),
        ("activation", dict(activation="gelu")),
        ("w13_bias", dict(w13_bias=torch.ones(4, 3))),
        ("w2_bias", dict(w2_bias=torch.ones(4, 8).double())),
    ]:
        with pytest.raises(OpError) as info:
            triton_backend.fused_moe(x, w13, w2, w, ids, **kw)
        assert (info.value.op, info.value.arg) == ("fused_moe", arg)


@pytest.mark.parametrize(
    "kw",
    [
        dict(top_k=4, scoring="softmax", renormalize=True),
        dict(top_k=3, scoring="softmax", renormalize=False, n_group=4, topk_group=2, routed_scaling_factor=16.0),
        dict(
            top_k=4, scoring="sigmoid", renormalize=True, n_group=4, topk_group=2, routed_scaling_factor=2.5, bias=True
        ),
    ],
)
def test_route_matches_reference(kw, triton_backend):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(9, 16, generator=g) * 2
    if kw.pop("bias", False):
        kw["correction_bias"] = torch.randn(16, generator=g) * 0.3
    w, ids = triton_backend.route(logits, **kw)
    rw, rids = cpu_ref.route(logits, **kw)
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    assert torch.equal(ids, rids)
    torch.testing.assert_close(w, rw, atol=1e-6, rtol=1e-6)


def test_gpu_default_tiles():
    """The portable defaults a GPU gets (64-row tiles, BLOCK_K 32, 128-block scales), run in the
    interpreter: fused_moe, grouped_gemm and scaled_gemm with several K steps."""
    from hetero.kernels import gemm, moe

    gpu = Tuning(TuningTable(vendor="portable"), "generic", interpreted=False)
    g = torch.Generator().manual_seed(4)
    m, k, e, h, inter = 11, 2, 6, 72, 40
    x = torch.randn(m, h, generator=g).to(torch.bfloat16)
    w13 = (torch.randn(e, 2 * inter, h, generator=g) / math.sqrt(h)).to(torch.bfloat16)
    w2 = (torch.randn(e, h, inter, generator=g) / math.sqrt(inter)).to(torch.bfloat16)
    ids, w = hot_ids(g, m, k, [0, 2, 3]), torch.rand(m, k, generator=g)
    got = moe.fused_moe(x, w13, w2, w, ids, tuning=gpu)
    torch.testing.assert_close(got, cpu_ref.fused_moe(x, w13, w2, w, ids), atol=2e-2, rtol=2e-2)
    ends = torch.tensor([3, 3, 70, 80], dtype=torch.int32)
    a, b = torch.randn(90, 72, generator=g), torch.randn(4, 24, 72, generator=g)
    from hetero_cpu_ref.gemm import grouped_gemm, scaled_gemm

    torch.testing.assert_close(
        gemm.grouped_gemm(a, b, ends, tuning=gpu), grouped_gemm(a, b, ends), atol=1e-4, rtol=1e-5
    )
    qa = torch.randn(5, 300, generator=g).to(torch.float8_e4m3fn)
    qb = torch.randn(130, 300, generator=g).to(torch.float8_e4m3fn)
    sa, sb = torch.rand(5, 3, generator=g), torch.rand(2, 3, generator=g)
    torch.testing.assert_close(
        gemm.scaled_gemm(qa, qb, sa, sb, out_dtype=torch.float32, tuning=gpu),
        scaled_gemm(qa, qb, sa, sb, out_dtype=torch.float32),
        atol=1e-4,
        rtol=1e-5,
    )
