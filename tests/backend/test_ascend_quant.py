"""hetero-ascend's quantized ops (spec 1.4) without an NPU: scaled_grouped_gemm -> npu_grouped_matmul's int8
per-token form checked on CPU against hetero_cpu_ref, and every decline with its reason.

The fake npu_grouped_matmul below is written from the op-plugin documentation (cited in hetero_ascend.quant),
not from hetero's spec: it asserts the documented argument forms (int8 x and one 3-D weight, the scale dtype
each output dtype asks for, float32 per-token scales, a cumsum group_list ending at x's rows) and starts its
output as NaN. The fake npu_dynamic_quant reproduces the A2/A3 kernel's arithmetic to show why
quantize_activation is declined. None of this has run on an NPU.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("hetero_ascend.plugin", reason="hetero-ascend is not installed (pip install -e backends/ascend)")
import hetero  # noqa: E402
import hetero_cpu_ref.gemm as ref_gemm  # noqa: E402
import hetero_cpu_ref.quant as ref_quant  # noqa: E402
from hetero.spec import OPS  # noqa: E402
from hetero_ascend import common, plugin, quant  # noqa: E402
from hetero_ascend.plugin import AscendBackend  # noqa: E402

I8 = torch.int8


def npu_grouped_matmul(
    x,
    weight,
    *,
    group_list,
    split_item,
    group_type,
    group_list_type,
    scale=None,
    per_token_scale=None,
    output_dtype=None,
):
    """One 2-D x, one 3-D weight [G, K, N], one output (group_type 0): y_i = x_i @ weight_i over the rows of group
    i (cumsum group_list ending at x's rows, <= 1024 groups); the per-token full quantization form (doc table 2)
    scales it, y_i x scale_i x pertokenscale_i, with bfloat16 scales for bfloat16 output or float32 for float16."""
    (x,), (w,) = x, weight
    assert split_item in (2, 3) and group_type == 0 and group_list_type == 0
    assert x.dim() == 2 and x.is_contiguous() and w.dim() == 3 and w.shape[1] == x.shape[1] and x.dtype == w.dtype
    assert group_list.dtype == torch.int64 and group_list.shape == (w.shape[0],) and w.shape[0] <= 1024
    ends = group_list.tolist()
    assert ends == sorted(ends) and ends[0] >= 0 and ends[-1] == x.shape[0], ends
    if scale is not None:
        (s,), (pts,) = scale, per_token_scale
        assert x.dtype == I8 and s.dtype == {torch.bfloat16: torch.bfloat16, torch.float16: torch.float32}[output_dtype]
        assert s.shape == (w.shape[0], w.shape[2]) and pts.dtype == torch.float32 and pts.shape == (x.shape[0],)
    y = torch.full((x.shape[0], w.shape[2]), float("nan"), dtype=torch.float64)
    start = 0
    for g, end in enumerate(ends):
        y[start:end] = x[start:end].double() @ w[g].double()  # int8: exact, |sum| < 2**53
        if scale is not None:
            y[start:end] *= s[g].double() * pts[start:end, None].double()
        start = end
    return [y.to(output_dtype or x.dtype)]


def npu_dynamic_quant(x):
    """The A2/A3 kernel's arithmetic (ops-nn dynamic_quant.h): inv = 127 / amax in float32, scale = 1 / inv,
    y = rint(x * inv); an all-zero row gets scale 1 (the aclnn golden)."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    inv = torch.tensor(127.0) / amax
    scale = torch.where(amax == 0, torch.ones_like(amax), 1 / inv)
    return torch.round(torch.nan_to_num(xf * inv)).clamp(-128, 127).to(I8), scale.squeeze(-1)


FAKE = SimpleNamespace(npu_grouped_matmul=npu_grouped_matmul)


@pytest.fixture
def npu(monkeypatch):
    monkeypatch.setattr(common, "torch_npu", lambda: FAKE)
    return AscendBackend("cpu")


def _case(seed, rows=11, groups=4, n=24, k=40, a_form="row", b_form="row", ends=(3, 3, 7, 9)):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-127, 128, (rows, k), generator=g).to(I8)
    b = torch.randint(-127, 128, (groups, n, k), generator=g).to(I8)
    a_scale = torch.rand(rows, 1, generator=g) * 0.02 + 1e-3 if a_form == "row" else torch.tensor([0.013])
    b_scale = (
        torch.rand(groups, n, 1, generator=g) * 0.01 + 1e-4
        if b_form == "row"
        else torch.rand(groups, generator=g) * 0.01
    )
    return a, b, a_scale, b_scale, torch.tensor(ends, dtype=torch.int32)


# ----------------------------------------------------------------------------- the mapping against the fake


@pytest.mark.parametrize("out_dtype,tol", [(torch.float16, 1e-3), (torch.bfloat16, 1.6e-2)])
@pytest.mark.parametrize("a_form,b_form", [("row", "row"), ("tensor", "group")])
def test_scaled_grouped_gemm_against_the_reference(npu, out_dtype, tol, a_form, b_form):
    a, b, sa, sb, ends = _case(1, a_form=a_form, b_form=b_form)  # an empty group, two rows past the last one
    got = npu.scaled_grouped_gemm(a, b, sa, sb, ends, out_dtype=out_dtype)
    want = ref_quant.scaled_grouped_gemm(a, b, sa, sb, ends, out_dtype=out_dtype)
    assert got.dtype == out_dtype and got.shape == want.shape and not got.isnan().any()
    assert got[9:].abs().max() == 0  # hetero: rows past the last group are zero
    torch.testing.assert_close(got.float(), want.float(), atol=tol * float(want.abs().max()), rtol=tol)


@pytest.mark.parametrize("groups,ends", [(4, (3, 3, 7, 9)), (300, None)])
def test_grouped_gemm_against_the_reference(npu, groups, ends):
    """One 3-D weight (the list form stops at 128 tensors; DeepSeek-V3 has 256 experts), the last cumsum at
    a's rows (the doc's rule) and the rows past hetero's last group zeroed."""
    g = torch.Generator().manual_seed(6)
    a, b = torch.randn(11, 8, generator=g), torch.randn(groups, 6, 8, generator=g)
    ends = torch.tensor(ends or [min(i // 25, 10) for i in range(groups)], dtype=torch.int32)
    got = npu.grouped_gemm(a, b, ends)
    want = ref_gemm.grouped_gemm(a, b, ends)
    assert not got.isnan().any() and got[int(ends[-1]) :].abs().sum() == 0
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert npu.grouped_gemm(a[:0], b, ends * 0).shape == (0, 6)
    assert "1024" in npu.supports("grouped_gemm", dtype="bfloat16", num_experts=2048)


def test_conversions_clamp_untrusted_group_ends():
    gl, last = quant.gmm_group_list(torch.tensor([4, 2, 30, -1], dtype=torch.int32), rows=9)
    assert gl.dtype == torch.int64 and gl.tolist() == [4, 4, 9, 9] and last.tolist() == [9]
    gl, last = quant.gmm_group_list(torch.tensor([2, 5], dtype=torch.int64), rows=8)
    assert gl.tolist() == [2, 8] and last.tolist() == [5]  # rows 5..7 join the last group, then are zeroed
    assert quant.token_scale(torch.tensor(0.5), "tensor", 3).tolist() == [0.5] * 3
    s = quant.channel_scale(torch.tensor([0.25, 0.1]), "group", 3, torch.float16)
    assert s.dtype == torch.float32 and s.shape == (2, 3) and s[1, 2] == torch.tensor(0.1)
    assert quant.channel_scale(torch.rand(2, 3, 1), "row", 3, torch.bfloat16).dtype == torch.bfloat16


def test_empty_calls_make_no_npu_call(monkeypatch):
    monkeypatch.setattr(common, "torch_npu", lambda: None)
    a, b, sa, sb, ends = _case(2, rows=0, ends=(0, 0, 0, 0))
    out = AscendBackend("cpu").scaled_grouped_gemm(a, b, sa.reshape(0, 1), sb, ends, out_dtype=torch.float16)
    assert out.shape == (0, 24) and out.dtype == torch.float16


@pytest.mark.parametrize("change", ["block", "zero_point", "float32"])
def test_outside_the_documented_form_takes_the_triton_kernel(npu, monkeypatch, change):
    a, b, sa, sb, ends = _case(3)
    kw = {"out_dtype": torch.bfloat16}
    if change == "block":  # 128x128 weight blocks [G, ceil(130/128), ceil(40/128)]
        b, sb = torch.randint(-127, 128, (4, 130, 40)).to(I8), torch.rand(4, 2, 1)
    elif change == "zero_point":
        kw["a_zero_point"] = torch.zeros(11, 1, dtype=torch.int32)
    else:
        kw["out_dtype"] = torch.float32
    calls = []
    monkeypatch.setattr(
        plugin.TritonBackend, "scaled_grouped_gemm", lambda self, *args, **k: calls.append(k) or "triton"
    )
    assert npu.scaled_grouped_gemm(a, b, sa, sb, ends, **kw) == "triton" and calls[0]["out_dtype"] == kw["out_dtype"]


def test_malformed_calls_raise_before_any_npu_call(monkeypatch):
    monkeypatch.setattr(common, "torch_npu", lambda: None)
    a, b, sa, sb, ends = _case(4)
    with pytest.raises(hetero.OpError, match="a_scale"):
        AscendBackend("cpu").scaled_grouped_gemm(a, b, sa[:5], sb, ends)
    with pytest.raises(hetero.OpError, match="group_ends"):
        AscendBackend("cpu").scaled_grouped_gemm(a, b, sa, sb, ends[:2])


# ----------------------------------------------------------------------------- declines and the surface


def test_npu_dynamic_quant_arithmetic_is_not_quantize_activation():
    """Why quantize_activation is declined: the kernel's scale (1 / (127 / amax)) is not the spec's amax / 127
    bit for bit, and a zero row's scale is 1 (the spec: 1e-10 / 127)."""
    x = (torch.randn(256, 64, generator=torch.Generator().manual_seed(5)) * 3).to(torch.bfloat16)
    x[0] = 0
    q, scale = npu_dynamic_quant(x)
    want_q, want_scale = ref_quant.quantize_activation(x, dtype=I8, group_size=None)
    assert not torch.equal(scale, want_scale[:, 0]) and scale[0] == 1
    assert int((scale[1:] != want_scale[1:, 0]).sum()) > 10 and q.dtype == want_q.dtype


def test_supports_states_the_documented_limits():
    be = AscendBackend("meta")
    row = {
        "dtype": "int8",
        "num_experts": 256,
        "n": 4096,
        "k": 7168,
        "a_scale": "row",
        "b_scale": "row",
        "a_zero_point": False,
        "out_dtype": "bfloat16",
    }
    assert be.supports("scaled_grouped_gemm", **row) is None
    assert (
        be.supports("scaled_grouped_gemm", **{**row, "b_scale": "group", "a_scale": "tensor", "out_dtype": "float16"})
        is None
    )
    for change, words in (
        ({"dtype": "float8_e4m3fn"}, "Ascend 950"),
        ({"dtype": "float8_e4m3fnuz"}, "no fp8"),
        ({"a_scale": "block"}, "1x128"),
        ({"b_scale": "block"}, "128x128"),
        ({"a_zero_point": True}, "offset"),
        ({"out_dtype": "float32"}, "bfloat16 or float16"),
        ({"num_experts": 2048}, "1024"),
        ({"k": 65536}, "65536"),
    ):
        assert words in be.supports("scaled_grouped_gemm", **{**row, **change}), change
    for qd in ("int8", "float8_e4m3fn"):
        why = be.supports("quantize_activation", dtype="bfloat16", quant_dtype=qd, group_size=None, scale_fmt="float")
        assert why and ("rint(x * inv)" in why if qd == "int8" else "fp8" in why)
    assert "quantized composition" in be.supports(
        "fused_moe", dtype="bfloat16", w13_scale="block", act_quant="group128"
    )
    assert "fp8" in be.supports("fused_moe", w13_scale=True, act_quant="group128", weight_dtype="float8_e4m3fn")


def test_signatures_and_notes():
    for op in ("scaled_grouped_gemm", "quantize_activation", "fused_moe"):
        got = inspect.signature(getattr(AscendBackend, op)).parameters
        want = OPS[op].signature.parameters
        assert [(p.name, p.kind, p.default) for p in want.values()] == [
            (p.name, p.kind, p.default) for p in got.values() if p.name != "self"
        ], op
    notes = AscendBackend.op_notes()
    assert "never run on an NPU" in notes["scaled_grouped_gemm"] and "bfloat16" in notes["scaled_grouped_gemm"]
    assert "never run on an NPU" in AscendBackend.scaled_grouped_gemm.__doc__
    assert "npu_dynamic_quant" in notes["quantize_activation"] and "quantized mode" in notes["fused_moe"]
