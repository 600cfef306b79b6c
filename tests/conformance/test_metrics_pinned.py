"""Every conformance metric, tolerance row and verdict rule, pinned on hand-built tensors.

Each metric is checked against a value worked out by hand; each rule of the
verdict (``Runner._verdict``, see ``tolerances.py`` for the rule) has a case that
only that rule fails, so deleting or loosening it makes a test here fail; each
dtype's tolerance row is pinned by value and by inputs just inside (must pass)
and just outside (must fail) its bounds, so a row swapped for a looser or a
tighter one is caught. Outputs are given in float64 so the errors are exact;
the case's dtype only selects the tolerance row, as in a real run.
"""

from __future__ import annotations

import math

import pytest
import torch

from hetero.spec import OPS
from hetero.verify.case import DTYPES, Case
from hetero.verify.metrics import compare
from hetero.verify.tolerances import tolerance
from hetero_conformance.runner import CaseResult, Expected, Runner

NAN, INF = float("nan"), float("inf")

#: dtype -> (floor, max_rel_l2), written out here so a changed row is a failing test
ROWS = {
    "float32": (1e-5, 1e-5),
    "float16": (1e-3, 5e-3),
    "bfloat16": (8e-3, 2e-2),
    "float8_e4m3fn": (8e-3, 2e-2),
    "float8_e4m3fnuz": (8e-3, 2e-2),
    "int8": (8e-3, 2e-2),
}


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def verdict(
    got: torch.Tensor,
    oracle: torch.Tensor,
    reference: torch.Tensor | None = None,
    *,
    op: str = "gemm",
    dtype: str = "float32",
    name: str = "out",
    layout_dtype: torch.dtype = torch.float64,
) -> CaseResult:
    """The runner's verdict on one output ``got``, with the oracle and the reference run (default: exact)."""
    case = Case(op, "pinned", dtype, build=lambda gen, dt: {})
    reference = oracle.clone() if reference is None else reference
    exp = Expected(
        inputs={},
        oracle={name: oracle},
        reference={name: reference},
        layout={name: (tuple(oracle.shape), layout_dtype)},
    )
    return Runner(None, None)._verdict(case, {name: got}, exp, [])  # type: ignore[arg-type]


def ones(n: int, value: float = 1.0) -> torch.Tensor:
    return torch.full((n,), value, dtype=torch.float64)


def bumped(x: torch.Tensor, delta: float, index: int = 0) -> torch.Tensor:
    """``x`` with ``delta`` added to one element."""
    y = x.clone()
    y[index] += delta
    return y


# ---------------------------------------------------------------- metrics, by hand


def test_rel_l2_is_the_error_norm_over_the_oracle_norm():
    m = compare(t(3.0, 4.5), t(3.0, 4.0))  # ||(0, 0.5)|| / ||(3, 4)|| = 0.5 / 5
    assert m.rel_l2 == pytest.approx(0.1, rel=1e-12)


def test_rel_l2_is_normalised_by_the_oracle_not_the_output():
    assert compare(t(101.0), t(99.0)).rel_l2 == pytest.approx(2 / 99, rel=1e-12)
    assert compare(t(99.0), t(101.0)).rel_l2 == pytest.approx(2 / 101, rel=1e-12)


def test_rel_l2_against_an_all_zero_oracle_is_infinite_unless_exact():
    assert compare(t(0.0, 1e-9), t(0.0, 0.0)).rel_l2 == INF
    assert compare(t(0.0, 0.0), t(0.0, 0.0)).rel_l2 == 0.0


def test_max_abs_is_the_largest_elementwise_error():
    assert compare(t(1.0, 2.25, 2.5), t(1.0, 2.0, 3.0)).max_abs == pytest.approx(0.5, rel=1e-12)


def test_max_rel_clamps_the_denominator_at_a_thousandth_of_the_scale():
    # scale 100: denominators below 0.1 count as 0.1; element 1 is 0.05 / 0.1, not 0.05 / 0.001
    m = compare(t(100.5, 0.051), t(100.0, 0.001))
    assert m.max_rel == pytest.approx(0.5, rel=1e-9)


def test_cosine_of_output_and_oracle():
    assert compare(t(1.0, 0.0), t(1.0, 1.0)).cosine == pytest.approx(1 / math.sqrt(2), rel=1e-12)
    assert compare(t(-2.0, -2.0), t(1.0, 1.0)).cosine == pytest.approx(-1.0, rel=1e-12)
    assert compare(t(0.0, 0.0), t(0.0, 0.0)).cosine == 1.0
    assert compare(t(0.0, 0.0), t(1.0, 1.0)).cosine == 0.0


def test_scale_is_the_largest_finite_oracle_magnitude():
    m = compare(t(-7.0, 2.0, -INF), t(-7.0, 2.0, -INF))
    assert m.scale == 7.0 and m.numel == 3


def test_nonfinite_output_where_the_oracle_is_finite_is_counted():
    m = compare(t(NAN, INF, -INF, 1.0), t(1.0, 1.0, 1.0, 1.0))
    assert m.nonfinite_mismatch == 3


def test_nonfinite_oracle_must_be_matched_exactly():
    want = t(-INF, INF, NAN, -INF)
    assert compare(t(-INF, INF, NAN, -INF), want).nonfinite_mismatch == 0
    assert compare(t(0.0, -INF, 1.0, NAN), want).nonfinite_mismatch == 4


def test_errors_are_measured_over_elements_finite_on_both_sides():
    m = compare(t(NAN, 2.5, 3.0), t(1.0, 2.0, 3.0))
    assert m.max_abs == pytest.approx(0.5) and m.rel_l2 == pytest.approx(0.5 / math.sqrt(13), rel=1e-12)


# ---------------------------------------------------------------- tolerance rows, by value


def test_every_case_dtype_has_a_pinned_row():
    assert set(ROWS) == set(DTYPES)


@pytest.mark.parametrize("dtype", sorted(ROWS))
def test_tolerance_row_values(dtype):
    tol = tolerance(dtype)
    assert (tol.floor, tol.max_rel_l2) == ROWS[dtype] and tol.rationale


@pytest.mark.parametrize(
    "op, name",
    [
        ("write_kv", "k_cache"),
        ("write_kv", "v_cache"),
        ("write_mla_kv", "ckv_cache"),
        ("write_mla_kv", "kpe_cache"),
        ("moe_permute", "x_sorted"),
    ],
)
def test_data_movement_outputs_are_declared_exact_by_the_spec(op, name):
    assert OPS[op].output(name).compare == "exact"


def test_an_output_in_a_finer_dtype_is_held_to_that_dtypes_row():
    for dtype in DTYPES:
        tol = tolerance(dtype, "float32")
        assert (tol.floor, tol.max_rel_l2) == ROWS["float32"], dtype
    assert tolerance("float32", "bfloat16") == tolerance("float32")


# ---------------------------------------------------------------- tolerance rows, by input
# max_abs bound with an exact reference: floor * scale. The oracle is 100 everywhere (scale 100)
# and one element of 10,000 is off, so rel_l2 stays far below its bound and only the floor decides.

N = 10_000


def _floor_probe(dtype: str, k: float) -> CaseResult:
    floor, _ = ROWS[dtype]
    oracle = ones(N, 100.0)
    return verdict(bumped(oracle, k * floor * 100.0), oracle, dtype=dtype)


@pytest.mark.parametrize("dtype", sorted(ROWS))
def test_an_error_just_inside_the_dtype_floor_passes(dtype):
    res = _floor_probe(dtype, 0.9)
    assert res.status == "pass", res.message


@pytest.mark.parametrize("dtype", sorted(ROWS))
def test_an_error_just_outside_the_dtype_floor_fails_on_max_abs(dtype):
    res = _floor_probe(dtype, 1.1)
    assert res.status == "fail" and "max abs error" in res.message and "relative L2" not in res.message


# rel_l2 bound: every element off by the same relative error k * max_rel_l2, and the reference
# just as wrong, so the max_abs bound (2 x the reference's error) passes and only rel_l2 decides.


def _rel_l2_probe(dtype: str, k: float) -> CaseResult:
    _, max_rel_l2 = ROWS[dtype]
    oracle = ones(64, 3.0)
    wrong = oracle * (1 + k * max_rel_l2)
    return verdict(wrong, oracle, reference=wrong, dtype=dtype)


@pytest.mark.parametrize("dtype", sorted(ROWS))
def test_an_error_just_inside_the_dtype_rel_l2_bound_passes(dtype):
    res = _rel_l2_probe(dtype, 0.9)
    assert res.status == "pass", res.message


@pytest.mark.parametrize("dtype", sorted(ROWS))
def test_an_error_just_outside_the_dtype_rel_l2_bound_fails_on_rel_l2(dtype):
    res = _rel_l2_probe(dtype, 1.1)
    assert res.status == "fail" and "relative L2" in res.message and "max abs" not in res.message


def test_float16_is_held_to_its_own_row_not_bfloat16s():
    """An error bfloat16 tolerates (under its floor and rel_l2 bound) fails as float16."""
    oracle = ones(N, 1.0)
    got = bumped(oracle, 4e-3)
    assert verdict(got, oracle, dtype="bfloat16").status == "pass"
    res = verdict(got, oracle, dtype="float16")
    assert res.status == "fail" and "max abs error" in res.message


def test_data_movement_fails_on_any_difference():
    oracle = ones(8, 0.5)
    res = verdict(bumped(oracle, 1e-12), oracle, op="write_kv", name="k_cache")
    assert res.status == "fail" and "1 of 8 elements differ (exact)" in res.message
    assert verdict(oracle.clone(), oracle, op="write_kv", name="k_cache").status == "pass"


def test_route_weights_in_bfloat16_are_held_to_the_float32_row():
    oracle = ones(N, 0.5)
    got = bumped(oracle, 1e-5)  # 2e-5 of the scale: inside bfloat16's floor, outside float32's 1e-5
    res = verdict(got, oracle, op="route", dtype="bfloat16", name="weights", layout_dtype=torch.float32)
    assert res.status == "fail" and "max abs error" in res.message
    assert (
        verdict(
            bumped(oracle, 4e-6), oracle, op="route", dtype="bfloat16", name="weights", layout_dtype=torch.float32
        ).status
        == "pass"
    )


# ---------------------------------------------------------------- verdict rules


def test_nan_where_the_oracle_is_finite_fails():
    """The NaN element is left out of max_abs and rel_l2, so only the non-finite rule can catch it."""
    oracle = ones(16)
    res = verdict(bumped(oracle, NAN, 3), oracle)
    assert res.status == "fail" and "1 elements NaN/Inf" in res.message
    assert res.outputs["out"]["nonfinite_mismatch"] == 1
    assert "max abs" not in res.message and "relative L2" not in res.message


def test_inf_where_the_oracle_is_finite_fails():
    oracle = ones(16)
    res = verdict(bumped(oracle, -INF, 0), oracle)
    assert res.status == "fail" and "NaN/Inf" in res.message


def test_a_finite_output_where_the_oracle_is_minus_inf_fails():
    """An empty attention row: lse is -inf in the oracle and must be -inf in the output."""
    oracle = t(-INF, 0.5, 0.25)
    res = verdict(t(-1e30, 0.5, 0.25), oracle, op="paged_attention", name="lse")
    assert res.status == "fail" and "NaN/Inf" in res.message
    assert verdict(t(-INF, 0.5, 0.25), oracle, op="paged_attention", name="lse").status == "pass"


def test_max_abs_bound_is_twice_the_reference_error_plus_the_floor():
    # reference off by r = 1e-4 on one element; bound = 2r + 1e-5 * scale 1 = 2.1e-4
    oracle = ones(N)
    reference = bumped(oracle, 1e-4, 7)
    assert verdict(bumped(oracle, 1.9e-4, 5), oracle, reference).status == "pass"
    res = verdict(bumped(oracle, 2.3e-4, 5), oracle, reference)
    assert res.status == "fail" and "max abs error" in res.message and "relative L2" not in res.message
    assert res.outputs["out"]["bound_max_abs"] == pytest.approx(2.1e-4, rel=1e-9)


def test_one_far_off_element_is_caught_by_max_abs_alone():
    oracle = ones(N)
    res = verdict(bumped(oracle, 0.5), oracle, dtype="bfloat16")  # rel_l2 0.005 is under 2e-2
    assert res.outputs["out"]["rel_l2"] < ROWS["bfloat16"][1]
    assert res.status == "fail" and "max abs error" in res.message


def test_an_error_the_reference_shares_is_caught_by_rel_l2_alone():
    """A reference that is itself wrong lifts the max_abs bound; the absolute rel_l2 bound still holds."""
    oracle = ones(N)
    wrong = oracle + 1e-2
    res = verdict(wrong, oracle, reference=wrong)
    assert res.status == "fail" and "relative L2 error" in res.message and "max abs" not in res.message


def test_rel_l2_verdict_is_normalised_by_the_oracle_in_both_directions():
    """|99 - 101| is 2.02% of the oracle 99 but 1.98% of 101: the oracle's norm decides (bfloat16 bound 2%)."""
    res = verdict(t(101.0), t(99.0), reference=t(101.0), dtype="bfloat16")
    assert res.status == "fail" and "relative L2" in res.message and "max abs" not in res.message
    res = verdict(t(99.0), t(101.0), reference=t(99.0), dtype="bfloat16")
    assert res.status == "pass", res.message


def test_integer_outputs_must_match_element_for_element():
    want = torch.tensor([0, 3, 5, 9])
    res = verdict(torch.tensor([0, 3, 6, 9]), want, op="moe_permute", name="perm")
    assert res.status == "fail" and "1 of 4 elements differ (exact)" in res.message
    assert verdict(want.clone(), want, op="moe_permute", name="perm").status == "pass"


def test_route_ids_that_differ_in_one_expert_fail():
    """ids reach the verdict sorted per token (align_route); one differing expert id fails."""
    want = torch.tensor([[1, 4], [0, 2]])
    res = verdict(torch.tensor([[1, 4], [0, 3]]), want, op="route", dtype="bfloat16", name="ids")
    assert res.status == "fail" and "(ids_as_sets)" in res.message


def test_an_exact_output_passes_every_rule():
    oracle = t(-3.0, 0.0, 2.5, -INF)
    res = verdict(oracle.clone(), oracle, op="paged_attention", name="lse")
    assert res.status == "pass" and res.message == ""
    m = res.outputs["lse"]
    assert m["max_abs"] == 0.0 and m["rel_l2"] == 0.0 and m["nonfinite_mismatch"] == 0
