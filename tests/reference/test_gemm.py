"""The reference GEMMs (gemm, scaled_gemm, grouped_gemm) against independent formulations.

Oracles: float64 matmuls, torch.nn.functional.grouped_mm, our own float64
dequantization of tensors we quantize here, and torch's CPU scaled_mm where it runs.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

import hetero.spec
from hetero import OpError
from hetero_cpu_ref import gemm as ref

FP8 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
QMAX = {torch.float8_e4m3fn: 448.0, torch.float8_e4m3fnuz: 240.0, torch.int8: 127.0}


# Relative precision of a dtype: one rounding to it moves a value by at most this much.
def dtype_id(d: object) -> str | None:
    return str(d).replace("torch.", "") if isinstance(d, torch.dtype) else None


EPS = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24, torch.float64: 2.0**-53}


def randn(*shape: int, seed: int, dtype: torch.dtype = torch.float64, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)


def assert_near(
    got: torch.Tensor,
    want: torch.Tensor,
    dtype: torch.dtype,
    bound: torch.Tensor | None = None,
    ulps: float = 2.0,
    terms: int = 0,
) -> None:
    """|got - want| <= (ulps * eps(dtype) + terms * eps(acc)) * bound (bound defaults to |want| + its max / 64).

    ``terms`` is the length of the sums behind each element: accumulating k products
    in the accumulation dtype (float32, float64 for float64) can be off by up to
    about k roundings of the sum of magnitudes, and which fraction of that shows
    depends on the summation order the CPU's BLAS picks (it differs between machines)."""
    got, want = got.double(), want.double()
    if bound is None:
        bound = want.abs() + want.abs().max().clamp_min(1e-30) / 64
    acc = EPS[torch.float64] if dtype == torch.float64 else EPS[torch.float32]
    excess = (got - want).abs() - (ulps * EPS[dtype] + terms * acc) * bound
    assert got.shape == want.shape
    assert bool((excess <= 0).all()), (
        f"max excess {excess.max().item():.3g}, max err {(got - want).abs().max().item():.3g}"
    )


def raises(op: str, arg: str, fn, *args, **kwargs) -> OpError:
    with pytest.raises(OpError) as info:
        fn(*args, **kwargs)
    err = info.value
    assert (err.op, err.arg) == (op, arg), str(err)
    assert str(err).startswith(f"{op}: argument '{arg}'")
    return err


@pytest.mark.parametrize("name", ["gemm", "scaled_gemm", "grouped_gemm"])
def test_signature_is_the_spec(name):
    spec = hetero.spec.OPS[name]
    fn = getattr(ref, name)
    assert spec.check_signature(fn) is None
    assert str(inspect.signature(fn)) == str(spec.signature)


# ---------------------------------------------------------------- gemm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64], ids=dtype_id)
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemm_vs_float64(dtype, with_bias):
    a, b = randn(7, 33, seed=1, dtype=dtype), randn(5, 33, seed=2, dtype=dtype)
    bias = randn(5, seed=3, dtype=dtype) if with_bias else None
    a0, b0 = a.clone(), b.clone()
    out = ref.gemm(a, b, bias=bias)
    want = a.double() @ b.double().T + (bias.double() if with_bias else 0)
    assert out.dtype == dtype and out.shape == (7, 5)
    bound = a.double().abs() @ b.double().abs().T + (bias.double().abs() if with_bias else 0)
    assert_near(out, want, dtype, bound, terms=a.shape[1] + 1)  # K products and the bias
    assert torch.equal(a, a0) and torch.equal(b, b0)


def test_gemm_out_dtype_and_noncontiguous():
    a = randn(9, 40, seed=4, dtype=torch.bfloat16)[:, ::2]  # [9, 20], strided
    b = randn(20, 6, seed=5, dtype=torch.bfloat16).T  # [6, 20], transposed
    bias = randn(6, seed=6, dtype=torch.float32)
    out = ref.gemm(a, b, bias=bias, out_dtype=torch.float32)
    assert out.dtype == torch.float32
    want = a.double() @ b.double().T + bias.double()
    assert_near(out, want, torch.float32, a.double().abs() @ b.double().abs().T + bias.double().abs(), ulps=40)


def test_gemm_empty():
    out = ref.gemm(
        randn(0, 8, seed=7, dtype=torch.float32),
        randn(3, 8, seed=8, dtype=torch.float32),
        bias=randn(3, seed=9, dtype=torch.float32),
    )
    assert out.shape == (0, 3) and out.dtype == torch.float32
    out = ref.gemm(randn(2, 0, seed=7, dtype=torch.float32), randn(3, 0, seed=8, dtype=torch.float32))
    assert torch.equal(out, torch.zeros(2, 3))


def test_gemm_bad_inputs():
    a, b = randn(4, 8, seed=1, dtype=torch.float32), randn(3, 8, seed=2, dtype=torch.float32)
    raises("gemm", "a", ref.gemm, a[None], b)
    raises("gemm", "a", ref.gemm, a.to(torch.int32), b)
    raises("gemm", "b", ref.gemm, a, b.half())
    err = raises("gemm", "b", ref.gemm, a, randn(3, 9, seed=2, dtype=torch.float32))
    assert "K = 8" in str(err)
    raises("gemm", "b", ref.gemm, a, b.to("meta"))
    raises("gemm", "bias", ref.gemm, a, b, bias=torch.ones(4))
    raises("gemm", "bias", ref.gemm, a, b, bias=torch.ones(1, 3))
    raises("gemm", "bias", ref.gemm, a, b, bias=torch.ones(3, dtype=torch.int64))
    raises("gemm", "out_dtype", ref.gemm, a, b, out_dtype=torch.int32)
    raises("gemm", "a", ref.gemm, a.numpy(), b)


# ---------------------------------------------------------------- grouped_gemm


def grouped_oracle(a, b, ends):
    """Rows [ends[g-1], ends[g]) times b[g]^T, in float64, by explicit row loop."""
    out = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64)
    for row in range(a.shape[0]):
        g = next((g for g, e in enumerate(ends) if row < e), None)
        if g is not None:
            out[row] = b[g].double() @ a[row].double()
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=dtype_id)
@pytest.mark.parametrize("ends", [[0, 3, 3, 8, 8, 11], [5, 5, 14, 14, 14, 14], [0, 0, 0, 0, 0, 0]])
def test_grouped_gemm_vs_torch_grouped_mm(dtype, ends):
    m, n, k, groups = 14, 10, 24, len(ends)
    a, b = randn(m, k, seed=11, dtype=dtype), randn(groups, n, k, seed=12, dtype=dtype)
    group_ends = torch.tensor(ends, dtype=torch.int32)
    out = ref.grouped_gemm(a, b, group_ends)
    assert out.dtype == dtype and out.shape == (m, n)
    last = ends[-1]
    assert torch.equal(out[last:], torch.zeros(m - last, n, dtype=dtype))
    oracle = grouped_oracle(a, b, ends)
    assert_near(out, oracle, dtype, grouped_oracle(a.abs(), b.abs(), ends), terms=k)
    if last:  # torch's grouped_mm leaves rows past the last offset unwritten: compare the rest
        theirs = F.grouped_mm(a, b.transpose(-2, -1), offs=group_ends)
        assert_near(
            out[:last], theirs[:last], dtype, grouped_oracle(a.abs(), b.abs(), ends)[:last], ulps=4, terms=2 * k
        )


def test_grouped_gemm_float64_and_out_dtype():
    a, b = randn(9, 12, seed=13), randn(3, 5, 12, seed=14)
    ends = [2, 2, 7]
    out = ref.grouped_gemm(a, b, torch.tensor(ends, dtype=torch.int32))
    torch.testing.assert_close(out, grouped_oracle(a, b, ends), rtol=1e-13, atol=1e-13)
    out = ref.grouped_gemm(a.bfloat16(), b.bfloat16(), torch.tensor(ends, dtype=torch.int32), out_dtype=torch.float32)
    assert out.dtype == torch.float32
    assert_near(
        out,
        grouped_oracle(a.bfloat16(), b.bfloat16(), ends),
        torch.float32,
        grouped_oracle(a.abs(), b.abs(), ends) + 1,
        ulps=40,
    )


def test_grouped_gemm_empty_rows():
    out = ref.grouped_gemm(
        randn(0, 4, seed=1, dtype=torch.float32),
        randn(2, 3, 4, seed=2, dtype=torch.float32),
        torch.zeros(2, dtype=torch.int32),
    )
    assert out.shape == (0, 3)


def test_grouped_gemm_bad_inputs():
    a, b = randn(6, 4, seed=1, dtype=torch.float32), randn(3, 5, 4, seed=2, dtype=torch.float32)
    ends = torch.tensor([1, 4, 6], dtype=torch.int32)
    op = "grouped_gemm"
    raises(op, "group_ends", ref.grouped_gemm, a, b, torch.tensor([1, 4, 3], dtype=torch.int32))
    raises(op, "group_ends", ref.grouped_gemm, a, b, torch.tensor([-1, 4, 6], dtype=torch.int32))
    raises(op, "group_ends", ref.grouped_gemm, a, b, torch.tensor([1, 4, 7], dtype=torch.int32))
    raises(op, "group_ends", ref.grouped_gemm, a, b, torch.tensor([1, 6], dtype=torch.int32))
    raises(op, "group_ends", ref.grouped_gemm, a, b, ends.float())
    raises(op, "group_ends", ref.grouped_gemm, a, b, ends.to("meta"))
    raises(op, "b", ref.grouped_gemm, a, b[0], ends)
    raises(op, "b", ref.grouped_gemm, a, randn(3, 5, 6, seed=2, dtype=torch.float32), ends)
    raises(op, "b", ref.grouped_gemm, a, b.double(), ends)
    raises(op, "a", ref.grouped_gemm, a.to(torch.int8), b, ends)
    raises(op, "out_dtype", ref.grouped_gemm, a, b, ends, out_dtype=torch.int8)


# ---------------------------------------------------------------- scaled_gemm


def cover(form: str, rows: int, k: int, per_block_rows: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """For a scale form: index tensors (row_of[r], col_of[c]) mapping an element to its scale entry."""
    r, c = torch.arange(rows), torch.arange(k)
    if form == "tensor":
        return torch.zeros_like(r), torch.zeros_like(c)
    if form == "row":
        return r, torch.zeros_like(c)
    return (r if per_block_rows else r // 128), c // 128


def quantize(x: torch.Tensor, dtype: torch.dtype, form: str, per_block_rows: bool, seed: int):
    """Quantize float64 x [R, K] with scales of `form`; returns (q, scale float32, dequant(q) float64)."""
    rows, k = x.shape
    ri, ci = cover(form, rows, k, per_block_rows)
    nr, nc = int(ri.max()) + 1 if rows else 0, int(ci.max()) + 1 if k else 0
    entry = ri[:, None] * nc + ci[None, :]  # flat index of the scale entry covering each element
    amax = torch.zeros(nr * nc, dtype=torch.float64).scatter_reduce_(
        0, entry.reshape(-1), x.abs().reshape(-1), reduce="amax"
    )
    jitter = 1 + 0.25 * torch.rand(nr * nc, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    scale = (amax * jitter / QMAX[dtype]).clamp_min(1e-6).float()  # some headroom: not every tile hits qmax
    full = scale.double()[entry]
    q = (x / full).clamp(-QMAX[dtype], QMAX[dtype])
    q = q.round().to(dtype) if dtype == torch.int8 else q.to(dtype)
    shape = {"tensor": (), "row": (rows, 1), "block": (nr, nc)}[form]
    return q, scale.reshape(shape), q.double() * full


FORMS = [
    ("tensor", "tensor"),
    ("row", "row"),
    ("block", "block"),
    ("tensor", "block"),
    ("block", "row"),
    ("row", "tensor"),
]


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.int8], ids=dtype_id)
@pytest.mark.parametrize("forms", FORMS, ids=["-".join(f) for f in FORMS])
@pytest.mark.parametrize("mnk", [(5, 130, 300), (3, 20, 64)], ids=["partial-blocks", "one-block"])
def test_scaled_gemm_vs_dequantized_float64(dtype, forms, mnk):
    m, n, k = mnk
    a, sa, deq_a = quantize(randn(m, k, seed=21), dtype, forms[0], True, seed=1)
    b, sb, deq_b = quantize(randn(n, k, seed=22), dtype, forms[1], False, seed=2)
    out = ref.scaled_gemm(a, b, sa, sb, out_dtype=torch.float32)
    assert out.dtype == torch.float32 and out.shape == (m, n)
    bound = deq_a.abs() @ deq_b.abs().T
    assert_near(out, deq_a @ deq_b.T, torch.float32, bound, ulps=64)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
def test_scaled_gemm_out_dtype_and_bias(out_dtype):
    a, sa, deq_a = quantize(randn(6, 200, seed=31), torch.float8_e4m3fn, "block", True, seed=3)
    b, sb, deq_b = quantize(randn(9, 200, seed=32), torch.float8_e4m3fn, "block", False, seed=4)
    for bias in (randn(9, seed=33, dtype=torch.float32), randn(9, seed=33, dtype=out_dtype)):
        out = ref.scaled_gemm(a, b, sa, sb, bias=bias, out_dtype=out_dtype)
        assert out.dtype == out_dtype
        want = deq_a @ deq_b.T + bias.double()
        assert_near(out, want, out_dtype, deq_a.abs() @ deq_b.abs().T + bias.double().abs())
    assert ref.scaled_gemm(a, b, sa, sb).dtype == torch.bfloat16  # the default


def test_scaled_gemm_int8_accumulates_exactly():
    # Running sums pass 2**24 while odd, where float32 accumulation (even of exact 128-chunks) drops a unit.
    a = torch.tensor([[2] + [127] * 1100 + [127] * 1100], dtype=torch.int8)
    b = torch.tensor([[1] + [127] * 1100 + [-127] * 1100], dtype=torch.int8)
    one = torch.ones((), dtype=torch.float32)
    assert ref.scaled_gemm(a, b, one, one, out_dtype=torch.float32).item() == 2.0
    a2, b2 = (
        randn(4, 1000, seed=5, scale=60).round().clamp(-127, 127),
        randn(3, 1000, seed=6, scale=60).round().clamp(-127, 127),
    )
    out = ref.scaled_gemm(
        a2.to(torch.int8), b2.to(torch.int8), one.reshape(1), one.reshape(1, 1), out_dtype=torch.float32
    )
    assert torch.equal(out.double(), a2 @ b2.T)


def test_scaled_gemm_empty():
    a, b = torch.ones(0, 256, dtype=torch.float8_e4m3fn), torch.ones(4, 256, dtype=torch.float8_e4m3fn)
    out = ref.scaled_gemm(a, b, torch.ones(0, 2), torch.ones(1, 2))
    assert out.shape == (0, 4) and out.dtype == torch.bfloat16


@pytest.mark.parametrize("recipe", ["TensorWise", "RowWise"])
def test_scaled_gemm_vs_torch_scaled_mm(recipe):
    m, n, k = 16, 48, 96
    form = "tensor" if recipe == "TensorWise" else "row"
    a, sa, _ = quantize(randn(m, k, seed=41), torch.float8_e4m3fn, form, True, seed=7)
    b, sb, _ = quantize(randn(n, k, seed=42), torch.float8_e4m3fn, form, False, seed=8)
    kind = getattr(F.ScalingType, recipe)
    try:  # torch's CPU scaled_mm takes b as [K, N] and a row-wise b scale as [1, N]
        theirs = F.scaled_mm(
            a, b.T, sa, kind, sb.reshape(1, -1) if form == "row" else sb, kind, output_dtype=torch.float32
        )
    except (RuntimeError, ValueError, NotImplementedError, AttributeError) as e:
        pytest.skip(f"torch scaled_mm {recipe} does not run on CPU here: {e}")
    out = ref.scaled_gemm(a, b, sa, sb, out_dtype=torch.float32)
    bound = a.double().abs() @ b.double().abs().T * (sa.double().reshape(-1, 1) * sb.double().reshape(1, -1))
    assert_near(out, theirs, torch.float32, bound, ulps=64)


def test_scaled_gemm_bad_inputs():
    op = "scaled_gemm"
    m, n, k = 4, 130, 300
    a, b = torch.ones(m, k, dtype=torch.float8_e4m3fn), torch.ones(n, k, dtype=torch.float8_e4m3fn)
    s1 = torch.ones(())
    raises(op, "a", ref.scaled_gemm, a.half(), b, s1, s1)
    raises(op, "b", ref.scaled_gemm, a, b.to(torch.int8), s1, s1)
    raises(op, "b", ref.scaled_gemm, a, b[:, :200], s1, s1)
    raises(op, "b", ref.scaled_gemm, a, b[0], s1, s1)
    err = raises(op, "a_scale", ref.scaled_gemm, a, b, torch.ones(m, 2), s1)
    for form in ("per tensor", "per token", "128-blocks", "[4, 3]"):
        assert form in str(err)
    err = raises(op, "b_scale", ref.scaled_gemm, a, b, s1, torch.ones(n))
    for form in ("per tensor", "per output channel", "128-blocks", "[2, 3]"):
        assert form in str(err)
    raises(op, "b_scale", ref.scaled_gemm, a, b, s1, torch.ones(n, 3))  # a-style blocks on b
    raises(op, "a_scale", ref.scaled_gemm, a, b, torch.ones(m, 1, dtype=torch.float16), s1)
    raises(op, "a_scale", ref.scaled_gemm, a, b, 1.0, s1)
    raises(op, "b_scale", ref.scaled_gemm, a, b, s1, s1.to("meta"))
    raises(op, "out_dtype", ref.scaled_gemm, a, b, s1, s1, out_dtype=torch.float64)
    raises(op, "out_dtype", ref.scaled_gemm, a, b, s1, s1, out_dtype=torch.float8_e4m3fn)
    raises(op, "bias", ref.scaled_gemm, a, b, s1, s1, bias=torch.ones(n + 1))
    raises(op, "bias", ref.scaled_gemm, a, b, s1, s1, bias=torch.ones(n, dtype=torch.float16))
