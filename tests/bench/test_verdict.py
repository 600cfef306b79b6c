"""The regression verdict of ``hetero bench --compare`` / ``bench-engine --compare``, in both directions.

Pure functions on given numbers (``baseline.compare``, ``baseline.confirm`` and
the report's ``verdict`` word), nothing timed. Values are chosen exact in binary
(1.0 -> 1.25 is a change of exactly 0.25) so the threshold cases are exact.
"""

from __future__ import annotations

import math

from hetero.bench.baseline import Comparison, Metric, compare, confirm
from hetero.bench.report import report_dict, verdict

THRESHOLD = 0.25


def one(baseline: float, current: float, *, higher_is_better: bool = False, threshold: float = THRESHOLD) -> Comparison:
    """The comparison of a single metric measured ``baseline`` then ``current``."""
    unit = "tok/s" if higher_is_better else "s"
    saved = {"m": Metric("m", baseline, unit, higher_is_better)}
    [c] = compare(saved, [Metric("m", current, unit, higher_is_better)], threshold)
    return c


# ---------------------------------------------------------------- times (lower is better)


def test_slower_beyond_the_threshold_is_regressed():
    c = one(1.0, 1.5)
    assert c.change == 0.5 and c.regressed and verdict(c, THRESHOLD) == "REGRESSED"


def test_slower_within_the_threshold_is_ok():
    c = one(1.0, 1.125)
    assert c.change == 0.125 and not c.regressed and verdict(c, THRESHOLD) == "ok"


def test_slower_by_exactly_the_threshold_is_not_regressed():
    c = one(1.0, 1.25)
    assert c.change == THRESHOLD and not c.regressed and verdict(c, THRESHOLD) == "ok"


def test_faster_is_not_regressed_and_is_reported_as_faster():
    c = one(1.0, 0.5)
    assert c.change == -0.5 and not c.regressed and verdict(c, THRESHOLD) == "faster"


def test_much_faster_is_not_regressed():
    c = one(1.0, 0.0625)
    assert c.change == -0.9375 and not c.regressed


def test_faster_by_exactly_the_threshold_is_ok_not_faster():
    c = one(1.0, 0.75)
    assert c.change == -THRESHOLD and not c.regressed and verdict(c, THRESHOLD) == "ok"


def test_a_time_from_zero_to_nonzero_is_regressed():
    assert one(0.0, 1.0).regressed and one(0.0, 1.0).change == math.inf
    assert not one(0.0, 0.0).regressed


# ---------------------------------------------------------------- throughputs (higher is better)


def test_lower_throughput_beyond_the_threshold_is_regressed():
    c = one(100.0, 50.0, higher_is_better=True)
    assert c.change == 0.5 and c.regressed and verdict(c, THRESHOLD) == "REGRESSED"


def test_higher_throughput_is_not_regressed_and_is_reported_as_faster():
    c = one(100.0, 200.0, higher_is_better=True)
    assert c.change == -1.0 and not c.regressed and verdict(c, THRESHOLD) == "faster"


def test_lower_throughput_by_exactly_the_threshold_is_not_regressed():
    c = one(100.0, 75.0, higher_is_better=True)
    assert c.change == THRESHOLD and not c.regressed


# ---------------------------------------------------------------- the threshold argument


def test_the_threshold_argument_decides():
    assert one(1.0, 1.5, threshold=0.5).regressed is False
    assert one(1.0, 1.5, threshold=0.25).regressed is True


# ---------------------------------------------------------------- re-measurement and the report


def test_confirm_clears_a_regression_when_a_remeasurement_is_within_the_threshold():
    c = confirm(one(1.0, 1.5), [1.125, 1.75], THRESHOLD)
    assert not c.regressed and c.current == 1.125 and c.change == 0.125


def test_confirm_keeps_a_regression_when_every_remeasurement_is_slower():
    c = confirm(one(1.0, 1.5), [1.375, 2.0], THRESHOLD)
    assert c.regressed and c.current == 1.375


def test_confirm_never_turns_faster_into_regressed():
    c = confirm(one(1.0, 0.5), [0.75], THRESHOLD)
    assert not c.regressed and c.current == 0.5 and c.change == -0.5


def test_confirm_on_a_throughput_keeps_the_highest():
    c = confirm(one(100.0, 50.0, higher_is_better=True), [90.0, 60.0], THRESHOLD, higher_is_better=True)
    assert not c.regressed and c.current == 90.0


def test_only_regressed_metrics_are_listed_as_regressed_in_the_json_report():
    saved = {n: Metric(n, 1.0, "s") for n in ("slower", "faster", "same")}
    comparisons = compare(
        saved, [Metric("slower", 2.0, "s"), Metric("faster", 0.5, "s"), Metric("same", 1.0, "s")], THRESHOLD
    )
    doc = report_dict([], {}, None, "", comparisons, THRESHOLD)
    assert doc["comparison"]["regressed"] == ["slower"]
