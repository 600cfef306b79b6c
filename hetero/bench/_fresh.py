"""Re-timing op cases in a fresh Python process.

A process carries state that outlasts any pause: where the heap put the
operands (the offset between a kernel's input and output pages, 4K aliasing,
which pages the allocator maps fresh on each call), what glibc's dynamic mmap
threshold has become after everything the process freed. On the 2-core CI
machine that state made the quick ``moe_permute`` 64% slower for a whole run,
every re-measurement over 15 s included, while most new processes timed it at
the baseline (pyperf spawns worker processes for the same reason). So a
regression is re-measured in a new process, with a new memory layout, before
it fails a run.

``python -m hetero.bench._fresh REQUEST.json`` is the worker: it loads the
backend by name from the installed plugins, times the named cases and prints
``{case id: fastest call in seconds}`` as JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from typing import Sequence

from hetero.bench._timer import TimerConfig

__all__ = ["FreshProcessError", "time_in_fresh_process"]


class FreshProcessError(RuntimeError):
    """The worker process failed; the message holds the end of its stderr."""


def time_in_fresh_process(
    backend: str,
    tier: str,
    case_ids: Sequence[str],
    timer: TimerConfig,
    seed: int,
    threads: int | None,
    timeout: float = 600.0,
) -> dict[str, float]:
    """The fastest call of each case, timed by a new Python process on ``backend``."""
    request = {
        "backend": backend,
        "tier": tier,
        "cases": list(case_ids),
        "timer": asdict(timer),
        "seed": seed,
        "threads": threads,
    }
    cmd = [sys.executable, "-m", "hetero.bench._fresh", json.dumps(request)]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise FreshProcessError(f"no answer in {timeout:.0f} s") from None
    if run.returncode != 0:
        raise FreshProcessError(f"exit code {run.returncode}: {run.stderr.strip()[-400:]}")
    return {k: float(v) for k, v in json.loads(run.stdout.strip().splitlines()[-1]).items()}


def _worker(request: dict) -> dict[str, float]:
    import torch

    import hetero
    from hetero.bench.ops import BenchConfig, OpBench
    from hetero.bench.perf import perf_cases

    if request["threads"] is not None:
        torch.set_num_threads(request["threads"])
    config = BenchConfig(TimerConfig(**request["timer"]), reference=False, seed=request["seed"])
    bench = OpBench(hetero.load(request["backend"]), config, None)
    cases = {c.id: c for c in perf_cases(request["tier"])}
    return {i: bench.time_case(cases[i]).min for i in request["cases"]}


if __name__ == "__main__":
    print(json.dumps(_worker(json.loads(sys.argv[1]))))
