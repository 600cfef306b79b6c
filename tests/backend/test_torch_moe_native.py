"""hetero-torch's native CPU expert GEMM (``_moe_native``): fused_moe against the float64 reference through
it, its own bounds checks, in-place weight updates, and the portable path when it is off or cannot build."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import hetero
from hetero.verify.metrics import compare
from hetero.verify.tolerances import tolerance

pytest.importorskip("hetero_torch")
from hetero_torch import _moe_native, _native  # noqa: E402
from hetero_torch._gemm_packed import DTYPES as PACKED_DTYPES  # noqa: E402

REF = hetero.load("cpu_ref")


def _module():
    module, why = _native.extension()
    if module is None:
        pytest.skip(f"the native expert GEMM is not available here: {why}")
    return module


def _case(gen, rows, hidden, inter, experts, k, bias):
    x = torch.randn(rows, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, generator=gen) / inter**0.5
    logits = torch.randn(rows, experts, generator=gen)
    logits[:, 0] = -1e4  # expert 0 owns no pair: its tiles must be skipped, not read
    weights, ids = REF.route(logits, top_k=k)
    b13 = torch.randn(experts, 2 * inter, generator=gen) if bias else None
    b2 = torch.randn(experts, hidden, generator=gen) if bias else None
    return x, w13, w2, weights, ids, b13, b2


@pytest.mark.parametrize(
    "rows,hidden,inter,experts,k,bias,activation",
    [
        (0, 64, 32, 4, 2, False, "silu"),  # no tokens
        (1, 64, 32, 4, 2, False, "silu"),
        (7, 72, 40, 5, 1, True, "silu"),  # columns not a multiple of the panel width
        (33, 96, 48, 6, 3, False, "swiglu_clamp"),  # rows past one micro-tile, every tail of it
        (130, 64, 96, 8, 2, True, "swigluoai"),
    ],
)
def test_fused_moe_through_the_native_kernel_matches_float64(rows, hidden, inter, experts, k, bias, activation):
    _module()
    ops = hetero.load("torch")
    gen = torch.Generator().manual_seed(rows)
    x, w13, w2, weights, ids, b13, b2 = _case(gen, rows, hidden, inter, experts, k, bias)
    opts = dict(activation=activation, limit=None if activation == "silu" else 7.0)
    native = _moe_native.native_fused_moe(x, w13, w2, weights, ids, activation, 1.702, opts["limit"], b13, b2)
    assert native is not None
    got = ops.fused_moe(x, w13, w2, weights, ids, w13_bias=b13, w2_bias=b2, **opts)
    wide = [None if t is None else t.double() for t in (x, w13, w2, weights, b13, b2)]
    want = REF.fused_moe(*wide[:4], ids, w13_bias=wide[4], w2_bias=wide[5], **opts)
    assert torch.equal(got, native)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("bias", [False, True])
# about 5, 10 and 80 pairs an expert (past AMX_ROWS, and past one AMX_RUN); odd widths: a half pair
@pytest.mark.parametrize("rows, hidden, inter", [(20, 256, 96), (40, 256, 96), (20, 129, 33), (300, 129, 33)])
def test_bf16_experts_match_float64(rows, hidden, inter, bias):
    """bfloat16 x and experts (Qwen3-MoE-like widths): the float64 result on the same bf16 values.
    20 rows x top-4 over 16 experts (5 pairs an expert) run the native kernel; 40 and 300 rows run
    it where its experts with many rows become brgemm tile GEMMs (bf16_tiles), else oneDNN's grouped
    GEMMs where oneDNN has a bf16 path. All round the projections and the hidden rows to bf16 as the
    spec's r() does (the kernel where the build has AVX512-BF16; without, it rounds only its
    output), so all are held to the rounded paths' tolerance."""
    _module()
    gen = torch.Generator().manual_seed(11)
    x, w13, w2, weights, ids, b13, b2 = _case(gen, rows, hidden, inter, 16, 4, bias)  # routing weights stay float32
    x, w13, w2, b13, b2 = (None if t is None else t.to(torch.bfloat16) for t in (x, w13, w2, b13, b2))
    native = _moe_native.native_fused_moe(x, w13, w2, weights, ids, "silu", 1.0, None, b13, b2)
    few = rows * 4 <= _moe_native.BF16_MAX_PAIRS_PER_EXPERT * 16
    kernel = few or torch.bfloat16 not in PACKED_DTYPES or _module().bf16_tiles()
    assert (native is not None) == kernel
    got = hetero.load("torch").fused_moe(x, w13, w2, weights, ids, w13_bias=b13, w2_bias=b2)
    assert got.dtype == torch.bfloat16
    if kernel:
        assert torch.equal(got, native)
        assert getattr(w13, "_hetero_torch_panels")[1].dtype == torch.bfloat16  # panels keep the weights' bytes
        assert not hasattr(w13, "_hetero_torch_packed")  # and are the only copy: oneDNN packed none
    elif not bias:  # expert weights are packed at their first call, not at a later (timed) one
        assert isinstance(getattr(w13, "_hetero_torch_packed")[1], list)
    wide = [None if t is None else t.double() for t in (x, w13, w2, weights, b13, b2)]
    want = REF.fused_moe(*wide[:4], ids, w13_bias=wide[4], w2_bias=wide[5])
    # the spec's bfloat16 tolerance, as conformance holds fused_moe to it: element by element, a product of
    # rounded hidden rows that cancels to near 0 can miss by more than atol (AVX512-BF16's dot-product
    # instruction, without AMX, rounds its pair sums)
    allowed, m = tolerance("bfloat16"), compare(got, want)
    assert m.max_abs <= allowed.floor * m.scale and m.rel_l2 <= allowed.max_rel_l2, m


def test_an_in_place_weight_update_repacks():
    _module()
    ops = hetero.load("torch")
    gen = torch.Generator().manual_seed(3)
    x, w13, w2, weights, ids, _, _ = _case(gen, 9, 64, 32, 4, 2, False)
    before = ops.fused_moe(x, w13, w2, weights, ids)
    w2.mul_(2)
    torch.testing.assert_close(ops.fused_moe(x, w13, w2, weights, ids), 2 * before, atol=1e-5, rtol=1e-5)


def _kernel_args(module):
    width = module.panel_width()
    return {
        "x": torch.randn(2, 16),
        "ids": torch.tensor([[1, 3], [0, 0]], dtype=torch.int32),
        "weights": torch.rand(2, 2),
        "p13": torch.randn(4, 2, 16, width),
        "inter": 5,
        "p2": torch.randn(4, 1, 5, width),
        "b13": None,
        "b2": None,
        "act": 0,
    }


@pytest.mark.parametrize(
    "error,what,change",
    [
        (
            IndexError,
            "an expert id is out of range: 4 at pair 1",
            lambda a: {**a, "ids": torch.tensor([[0, 4], [0, 0]], dtype=torch.int32)},
        ),
        (IndexError, "an expert id is out of range: -1", lambda a: {**a, "ids": torch.tensor([[-1, 0], [0, 0]])}),
        (
            RuntimeError,
            "ids must be contiguous int32 or int64",
            lambda a: {**a, "ids": torch.zeros(3, 2, dtype=torch.int32)},
        ),
        (RuntimeError, "weights must be", lambda a: {**a, "weights": torch.rand(2, 3)}),
        (RuntimeError, "K = 8", lambda a: {**a, "x": torch.randn(2, 8)}),
        (RuntimeError, "expected 4 panels", lambda a: {**a, "inter": 40}),
        (RuntimeError, "E experts in both projections", lambda a: {**a, "p2": torch.randn(3, 1, 5, a["p2"].shape[3])}),
        (RuntimeError, "a bias must be", lambda a: {**a, "b13": torch.randn(4, 3)}),
        (RuntimeError, "a known activation", lambda a: {**a, "act": 3}),
        (RuntimeError, "must both be float32 or both bfloat16", lambda a: {**a, "p2": a["p2"].bfloat16()}),
    ],
)
def test_the_kernel_rejects_what_would_read_outside_its_tensors(error, what, change):
    a = change(_kernel_args(module := _module()))
    with pytest.raises(error, match=what):
        module.fused_moe(
            a["x"], a["ids"], a["weights"], a["p13"], a["inter"], a["p2"], a["b13"], a["b2"], a["act"], 1.702, 7.0
        )


def test_int64_ids_past_int32_are_rejected_not_wrapped():
    _module()
    gen = torch.Generator().manual_seed(6)
    x, w13, w2, weights, ids, _, _ = _case(gen, 3, 64, 32, 4, 2, False)
    wide = ids.long()
    wide[1, 0] = (1 << 32) + 1  # wraps to 1 as int32
    with pytest.raises(hetero.OpError, match="fused_moe: argument 'ids'"):
        hetero.load("torch", validate=False).fused_moe(x, w13, w2, weights, wide)


def test_off_by_environment_keeps_the_grouped_gemms():
    code = (
        "import torch, hetero; from hetero_torch import _moe_native as m, _native, _attention_native as a; "
        "print(_native.extension()[1]); assert not a.applies(torch.empty(1, 1, 1, 1), torch.empty(1, 1, 1, 1)); "
        "x = torch.randn(3, 8); w, ids = hetero.load('cpu_ref').route(torch.randn(3, 4), top_k=2); "
        "w13, w2 = torch.randn(4, 12, 8), torch.randn(4, 8, 6); "
        "print(m.native_fused_moe(x, w13, w2, w, ids, 'silu', 1.702, None, None, None)); "
        "print(hetero.load('torch').fused_moe(x, w13, w2, w, ids).shape)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HETERO_TORCH_NATIVE": "0"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["HETERO_TORCH_NATIVE=0", "None", "torch.Size([3, 8])"]


def test_a_build_that_fails_warns_and_declines(tmp_path, monkeypatch):
    broken = tmp_path / "expert_gemm.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(_native, "_SOURCES", [broken])
    with pytest.warns(RuntimeWarning, match="did not build"):
        module, why = _native.extension.__wrapped__()
    assert module is None and why


def test_a_compiled_fused_moe_is_one_graph_and_still_checks_the_ids():
    """Traced, the experts are one opaque op (fullgraph compiles) that range-checks the ids it indexes with."""
    ops = hetero.load("torch", validate=False)
    gen = torch.Generator().manual_seed(5)
    x, w13, w2, weights, ids, _, _ = _case(gen, 6, 64, 32, 4, 2, False)
    double = torch.compile(lambda *a: 2 * ops.fused_moe(*a), fullgraph=True)
    torch.testing.assert_close(double(x, w13, w2, weights, ids), 2 * ops.fused_moe(x, w13, w2, weights, ids))
    ids[2, 1] = 4
    with pytest.raises(hetero.OpError, match="fused_moe: argument 'ids'"):
        double(x, w13, w2, weights, ids)
