"""Collects the dispatch benchmarks' medians and prints per-call figures at the end of the session."""

from __future__ import annotations

import platform

import pytest
import torch

UNROLL = 10  # must match test_dispatch.UNROLL: each benchmarked call makes this many op calls


class DispatchResults:
    def __init__(self) -> None:
        self.ns: dict[tuple[str, str], float] = {}  # median ns per op call
        self.min_ns: dict[
            tuple[str, str], float
        ] = {}  # fastest round, ns per op call (less sensitive to a busy machine)

    def record(self, group: str, variant: str, benchmark) -> None:
        meta = getattr(benchmark, "stats", None)
        stats = getattr(meta, "stats", None)
        if stats is not None:  # None under --benchmark-disable
            self.ns[(group, variant)] = stats.median / UNROLL * 1e9
            self.min_ns[(group, variant)] = stats.min / UNROLL * 1e9


_RESULTS = DispatchResults()


@pytest.fixture(scope="session")
def dispatch_results() -> DispatchResults:
    return _RESULTS


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    ns = _RESULTS.ns
    if not ns:
        return
    tr = terminalreporter
    tr.section("hetero dispatch overhead (median ns per call)")
    tr.write_line(
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
        f"torch {torch.__version__}, python {platform.python_version()}"
    )
    tr.write_line(f"  {'group':9s} {'variant':22s} {'median':>10s}    {'min':>10s}")
    for (group, variant), v in sorted(ns.items()):
        tr.write_line(f"  {group:9s} {variant:22s} {v:10.1f} ns {_RESULTS.min_ns[(group, variant)]:10.1f} ns")
    d = lambda g, v: ns.get((g, v))  # noqa: E731
    direct, hetero_ops = d("dispatch", "direct"), d("dispatch", "hetero_ops")
    if direct is not None and hetero_ops is not None:
        overhead = hetero_ops - direct
        min_overhead = _RESULTS.min_ns[("dispatch", "hetero_ops")] - _RESULTS.min_ns[("dispatch", "direct")]
        tr.write_line(
            f"hetero overhead (hetero_ops - direct): {overhead:.1f} ns by medians, "
            f"{min_overhead:.1f} ns by minima (target < 100 ns)"
        )
        pluggy_ns = d("dispatch", "pluggy_hook")
        if pluggy_ns is not None:
            tr.write_line(f"pluggy hook overhead (pluggy_hook - direct): {pluggy_ns - direct:.1f} ns")
        clone_ns = d("dispatch", "direct_clone")
        for name in ("custom_op", "custom_op_torch_ops"):
            c = d("dispatch", name)
            if c is not None and clone_ns is not None:
                cop = c - clone_ns
                ratio = f"{cop / overhead:.0f}x" if overhead > 0 else "n/a (hetero overhead <= 0 within noise)"
                tr.write_line(
                    f"{name} overhead ({name} - direct_clone): {cop:.1f} ns; "
                    f"ratio to hetero overhead: {ratio} (target >= 20x)"
                )
    fresh, profiled = d("seam", "fresh"), d("seam", "profiled")
    if fresh is not None and profiled is not None:
        tr.write_line(
            f"seam: a layer's op call after hetero profile ran and stopped / never profiled: "
            f"{profiled / fresh:.3f} by medians, "
            f"{_RESULTS.min_ns[('seam', 'profiled')] / _RESULTS.min_ns[('seam', 'fresh')]:.3f} by minima (target 1)"
        )
    real_d = d("real_op", "direct_layers")
    for name in ("hetero_ops_private", "hetero_load_cpu_ref"):
        real_h = d("real_op", name)
        if real_d is not None and real_h is not None:
            tr.write_line(
                f"real op (cpu_ref silu_and_mul [1, 8]): {name} {real_h:.0f} ns, direct {real_d:.0f} ns, "
                f"difference {real_h - real_d:.1f} ns"
            )
