r"""The reference ops (cpu_ref) on their quick performance shapes, one benchmark per op, for pytest-benchmark.

Not part of the test run (pyproject's testpaths is ``tests``). Run, save and compare:

    .venv/bin/python -m pytest benchmarks/test_ops_cpu.py --benchmark-only --benchmark-autosave
    .venv/bin/python -m pytest benchmarks/test_ops_cpu.py --benchmark-only \
        --benchmark-compare --benchmark-compare-fail=median:10%

The shapes are ``hetero.bench.perf.perf_cases("quick")`` (the first
case of each op), the same ones ``hetero bench cpu_ref --shapes quick`` times;
each benchmark's extra_info carries the op's flops and bytes from
``hetero.bench.model`` and the GB/s and GFLOP/s they give at the median.
"""

from __future__ import annotations

import pytest

import hetero_cpu_ref.plugin
from hetero.bench.model import work
from hetero.bench.perf import perf_cases
from hetero.spec import OPS


def _first_per_op() -> list:
    seen: dict[str, object] = {}
    for case in perf_cases("quick"):
        seen.setdefault(case.op, case)
    return list(seen.values())


CASES = _first_per_op()
REFERENCE = hetero_cpu_ref.plugin.CpuRefBackend()


@pytest.mark.benchmark(group="ops_cpu", max_time=0.5, min_rounds=5, warmup=True, warmup_iterations=2)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_reference_op(benchmark, case):
    inputs = case.inputs(0)
    bound = OPS[case.op].signature.bind(**inputs)
    fn = getattr(REFERENCE, case.op)
    fn(*bound.args, **bound.kwargs)  # fail early rather than benchmark an error
    benchmark(fn, *bound.args, **bound.kwargs)
    w = work(case.op, inputs)
    benchmark.extra_info.update(flops=w.flops, bytes=w.bytes)
    stats = getattr(getattr(benchmark, "stats", None), "stats", None)
    if stats is not None:  # None under --benchmark-disable
        benchmark.extra_info.update(gb_s=w.bytes / stats.median / 1e9, gflop_s=w.flops / stats.median / 1e9)
