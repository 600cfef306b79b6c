"""``--isolate``: each op family runs in its own worker process, so a crash or a hang is a verdict.

The parent starts ``python -m hetero_conformance._isolate_worker`` per family
(through the conformance spawner, ``_spawn``, as ``--world-size`` starts its ranks)
and sends it the backend name, seed, catalog and case ids as JSON on stdin (the
protocol is ``hetero_conformance._worker``'s). The worker loads the backend by
name from the installed entry points (the parent's ``sys.path`` is its
``PYTHONPATH``), rebuilds the cases from the catalog and reports ``ready``, then
``start`` and ``result`` per case.

- The worker dies (segfault, ``abort``, ``exit``): the case it had started is
  ``crashed`` with the signal or exit code and the end of its stderr; the
  family's cases it never reached are ``crashed`` too ("not run").
- A case runs longer than ``timeout`` seconds: the worker is killed, that case
  and the family's remaining ones are ``timeout``. Starting up (imports, loading
  the backend) is allowed ``max(timeout, STARTUP_S)``.

The other families run regardless.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

from hetero.verify.case import Case
from hetero_conformance._worker import STARTUP_S, Worker, drive
from hetero_conformance.runner import CaseResult

__all__ = ["run_isolated", "STARTUP_S"]

_WORKER = "hetero_conformance._isolate_worker"


def _verdicts(
    pending: dict[str, Case], current: str | None, status: str, why: str, family: str, seed: int
) -> list[CaseResult]:
    out = []
    for cid, case in pending.items():
        if cid == current:
            msg = why
        elif current is None:
            msg = f"not run: the {family} worker ended before running any case: {why}"
        else:
            msg = f"not run: the {family} worker was lost on {current} ({status})"
        out.append(CaseResult.of(case, status, msg, seed=case.seed(seed)))
    return out


def _run_family(
    family: str,
    cases: list[Case],
    config: dict[str, Any],
    timeout: float,
    on_start: Callable[[Case], None],
    on_result: Callable[[CaseResult], None],
) -> None:
    pending = {c.id: c for c in cases}
    started = [0.0]

    def on_message(msg: dict[str, Any]) -> float | None:
        if msg.get("event") == "start" and msg.get("id") in pending:  # each case gets ``timeout`` from its start
            started[0] = time.monotonic()
            return started[0] + timeout
        return None

    with Worker({**config, "ids": list(pending)}, _WORKER) as worker:
        lost = drive(
            worker,
            pending,
            CaseResult,
            deadline=time.monotonic() + max(timeout, STARTUP_S),
            on_message=on_message,
            on_start=on_start,
            on_result=on_result,
        )
        if lost is None:
            return
        status, current = lost
        if status == "crashed":
            why = f"the worker process died: {worker.death()}"
        elif current:
            why = f"killed after {time.monotonic() - started[0]:.0f} s on this case (--timeout {timeout:g})"
        else:
            why = f"no case started within {max(timeout, STARTUP_S):g} s"
        for result in _verdicts(pending, current, status, why, family, config["seed"]):
            on_result(result)


def run_isolated(
    name: str,
    cases: Iterable[Case],
    *,
    seed: int,
    timeout: float,
    catalog: str,
    quick: bool,
    on_start: Callable[[Case], None] = lambda c: None,
    on_result: Callable[[CaseResult], None] = lambda r: None,
) -> list[CaseResult]:
    """Run ``cases`` on backend ``name``, one worker process per op family; results in the given order."""
    cases = list(cases)
    families: dict[str, list[Case]] = {}
    for case in cases:
        families.setdefault(case.family, []).append(case)
    results: dict[str, CaseResult] = {}

    def collect(result: CaseResult) -> None:
        results[result.id] = result
        on_result(result)

    config = {"backend": name, "seed": seed, "catalog": catalog, "quick": quick}
    for family, group in families.items():
        _run_family(family, group, config, timeout, on_start, collect)
    return [results[c.id] for c in cases]
