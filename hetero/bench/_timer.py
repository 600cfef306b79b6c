"""Timing one op call: the host clock around synchronous CPU calls, device events on accelerators.

On CUDA/ROCm (and any device with a Triton driver) ``triton.testing.do_bench``
times each call between device events and flushes the L2 cache before each, so
a small op is not timed hot in cache; its warm-up and repetition counts follow
from the time budgets. Without Triton, accelerator events are recorded around
each call (``torch.Event``). On the CPU, ``time.perf_counter_ns`` brackets each
call, with the garbage collector paused while timing.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

__all__ = ["Timing", "TimerConfig", "measure", "steady_heap", "torch_threads"]

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
_MMAP_THRESHOLD_MAX = 32 << 20  # the largest mmap threshold glibc accepts on 64-bit


@dataclass(frozen=True)
class TimerConfig:
    """Warm-up calls, the least timed calls, the least seconds of timed calls, and a cap on calls."""

    warmup: int = 5
    reps: int = 20
    min_time: float = 0.2
    max_reps: int = 10_000


@dataclass(frozen=True)
class Timing:
    """The seconds of each timed call and how they were taken."""

    samples: tuple[float, ...]
    method: str

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)


def _host(fn: Callable[[], object], config: TimerConfig) -> Timing:
    for _ in range(config.warmup):
        fn()
    samples: list[int] = []
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        budget = config.min_time * 1e9
        spent = 0
        while (len(samples) < config.reps or spent < budget) and len(samples) < config.max_reps:
            start = time.perf_counter_ns()
            fn()
            samples.append(time.perf_counter_ns() - start)
            spent += samples[-1]
    finally:
        if enabled:
            gc.enable()
    return Timing(tuple(s / 1e9 for s in samples), "perf_counter")


def _do_bench(fn: Callable[[], object], config: TimerConfig) -> Timing:
    from triton.testing import do_bench

    times_ms = do_bench(fn, warmup=25, rep=max(100.0, config.min_time * 1e3), return_mode="all")
    return Timing(tuple(t / 1e3 for t in times_ms), "triton.testing.do_bench")


def _events(fn: Callable[[], object], device: torch.device, config: TimerConfig) -> Timing:
    for _ in range(config.warmup):
        fn()
    torch.accelerator.synchronize(device)
    pairs = []
    for _ in range(max(config.reps, 1)):
        start, end = torch.Event(device=device, enable_timing=True), torch.Event(device=device, enable_timing=True)
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    torch.accelerator.synchronize(device)
    return Timing(tuple(s.elapsed_time(e) / 1e3 for s, e in pairs), "torch.Event")


def measure(fn: Callable[[], object], device: torch.device, config: TimerConfig) -> Timing:
    """Time ``fn()`` (one op call on ``device``): warm-up, then many timed calls."""
    if device.type == "cpu":
        return _host(fn, config)
    try:
        import triton.testing  # noqa: F401
    except ImportError:
        return _events(fn, device, config)
    return _do_bench(fn, config)


def steady_heap() -> bool:
    """Fix glibc malloc's thresholds for the rest of the process; False where there is no glibc to tune.

    glibc moves its mmap threshold up each time the process frees a large
    mapped block, and trims the heap past twice that: so whether an op's
    temporaries of a few MiB come from the heap or from new, page-faulted
    mappings on every call depends on everything the process freed before.
    On the CI machine that alone made ``merge_attention`` (16 MiB temporaries)
    take 15 or 45 ms from one run to the next. Fixed thresholds (mapped from
    32 MiB, the heap never trimmed below 1 GiB) make every run the same.
    Process-wide and not undone: glibc has no call that restores its dynamic mode.
    """
    import ctypes
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = ctypes.CDLL(None).mallopt
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX) and mallopt(_M_TRIM_THRESHOLD, 1 << 30))


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """torch's CPU thread count set to ``n`` (None: left alone) for a run, then restored."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
