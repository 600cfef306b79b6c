"""hetero-torch's native CPU expert GEMM (``_moe_native``): fused_moe against the float64 reference through
it, its own bounds checks, in-place weight updates, and the portable path when it is off or cannot build."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import hetero

pytest.importorskip("hetero_torch")
from hetero_torch import _moe_native  # noqa: E402
from hetero_torch.moe import _activation  # noqa: E402

REF = hetero.load("cpu_ref")


def _module():
    module, why = _moe_native.extension()
    if module is None:
        pytest.skip(f"the native expert GEMM is not available here: {why}")
    return module


def _case(gen, rows, hidden, inter, experts, k, bias):
    x = torch.randn(rows, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden ** 0.5
    w2 = torch.randn(experts, hidden, inter, generator=gen) / inter ** 0.5
    logits = torch.randn(rows, experts, generator=gen)
    logits[:, 0] = -1e4  # expert 0 owns no pair: its tiles must be skipped, not read
    weights, ids = REF.route(logits, top_k=k)
    b13 = torch.randn(experts, 2 * inter, generator=gen) if bias else None
    b2 = torch.randn(experts, hidden, generator=gen) if bias else None
    return x, w13, w2, weights, ids, b13, b2


@pytest.mark.parametrize("rows,hidden,inter,experts,k,bias,activation", [
    (0, 64, 32, 4, 2, False, "silu"),           # no tokens
    (1, 64, 32, 4, 2, False, "silu"),
    (7, 72, 40, 5, 1, True, "silu"),            # columns not a multiple of the panel width
    (33, 96, 48, 6, 3, False, "swiglu_clamp"),  # rows past one micro-tile, every tail of it
    (130, 64, 96, 8, 2, True, "swigluoai"),
])
def test_fused_moe_through_the_native_kernel_matches_float64(rows, hidden, inter, experts, k, bias, activation):
    _module()
    ops = hetero.load("torch")
    gen = torch.Generator().manual_seed(rows)
    x, w13, w2, weights, ids, b13, b2 = _case(gen, rows, hidden, inter, experts, k, bias)
    opts = dict(activation=activation, limit=None if activation == "silu" else 7.0)
    act = lambda gu: _activation(gu, activation, 1.702, opts["limit"])  # noqa: E731
    native = _moe_native.native_fused_moe(x, w13, w2, weights, ids, act, b13, b2)
    assert native is not None
    got = ops.fused_moe(x, w13, w2, weights, ids, w13_bias=b13, w2_bias=b2, **opts)
    wide = [None if t is None else t.double() for t in (x, w13, w2, weights, b13, b2)]
    want = REF.fused_moe(*wide[:4], ids, w13_bias=wide[4], w2_bias=wide[5], **opts)
    assert torch.equal(got, native)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=2e-5)


def test_an_in_place_weight_update_repacks():
    _module()
    ops = hetero.load("torch")
    gen = torch.Generator().manual_seed(3)
    x, w13, w2, weights, ids, _, _ = _case(gen, 9, 64, 32, 4, 2, False)
    before = ops.fused_moe(x, w13, w2, weights, ids)
    w2.mul_(2)
    torch.testing.assert_close(ops.fused_moe(x, w13, w2, weights, ids), 2 * before, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("what,change", [
    ("an expert id is out of range", lambda a: {**a, "ids": torch.tensor([0, 4], dtype=torch.int32)}),
    ("an expert id is out of range", lambda a: {**a, "ids": torch.tensor([-1, 0], dtype=torch.int32)}),
    ("fewer rows than the pairs need", lambda a: {**a, "a_div": 1, "ids": torch.zeros(5, dtype=torch.int32)}),
    (r"K = a\.size\(1\)", lambda a: {**a, "a": torch.randn(2, 8)}),
    ("N does not match", lambda a: {**a, "n": 1000}),
    ("bias must be", lambda a: {**a, "bias": torch.randn(4, 3)}),
    ("ids must be 1-D int32", lambda a: {**a, "ids": torch.zeros(2, dtype=torch.int64)}),
])
def test_the_kernel_rejects_what_would_read_outside_its_tensors(what, change):
    module = _module()
    width = module.panel_width()
    args = {"a": torch.randn(2, 16), "a_div": 2, "ids": torch.tensor([1, 3], dtype=torch.int32),
            "packed": torch.randn(4, 1, 16, width), "n": 5, "bias": None}
    args = change(args)
    with pytest.raises(RuntimeError, match=what):
        module.expert_gemm(args["a"], args["a_div"], args["ids"], args["packed"], args["n"], args["bias"])


def test_off_by_environment_keeps_the_grouped_gemms():
    code = ("import torch, hetero; from hetero_torch import _moe_native as m; "
            "print(m.extension()[1]); x = torch.randn(3, 8); w, ids = hetero.load('cpu_ref').route(torch.randn(3, 4), top_k=2); "
            "w13, w2 = torch.randn(4, 12, 8), torch.randn(4, 8, 6); "
            "print(m.native_fused_moe(x, w13, w2, w, ids, lambda g: g[:, :6], None, None)); "
            "print(hetero.load('torch').fused_moe(x, w13, w2, w, ids).shape)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "HETERO_TORCH_NATIVE": "0"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["HETERO_TORCH_NATIVE=0", "None", "torch.Size([3, 8])"]


def test_a_build_that_fails_warns_and_declines(tmp_path, monkeypatch):
    broken = tmp_path / "expert_gemm.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(_moe_native, "_SOURCE", broken)
    with pytest.warns(RuntimeWarning, match="did not build"):
        module, why = _moe_native.extension.__wrapped__()
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
