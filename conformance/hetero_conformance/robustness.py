"""The robustness tier: malformed calls a backend must reject with ``hetero.OpError`` naming the op.

Every call of the catalog (``hetero_conformance.cases.malformed``) runs in its
own worker process, forked from a server that imported torch, hetero and the
backend once (``hetero_conformance._forkserver``), so a backend that crashes on
a bad index is a verdict, not the end of the run. Statuses per call:

- ``rejected``: raised a hetero error whose message names the op (passes);
- ``silent``: returned normally (fails; with validation off it passes for an
  index-content defect, whose result is then undefined);
- ``unclear``: raised another exception, or a hetero error not naming the op (fails);
- ``crashed``: the worker died (fails), ``timeout``: it ran past the limit (fails);
- ``fallback``: the op is not native, the reference ran: nothing was tested (passes).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from hetero.spec import OPS
from hetero_conformance._attempt import STATUSES, CallResult, attempt, load_calls, one_rank_comm
from hetero_conformance._progress import progress
from hetero_conformance._selectors import matches
from hetero_conformance._worker import STARTUP_S, Worker, drive
from hetero_conformance.cases.malformed import DEFAULT, Malformed
from hetero_conformance.suite import DEFAULT_CATALOG, SelectionError, SuiteResult, build_meta

__all__ = [
    "STATUSES",
    "CallResult",
    "RobustnessResult",
    "load_calls",
    "select_calls",
    "attempt",
    "one_rank_comm",
    "run_robustness",
    "selected_calls",
    "run_robustness_suite",
    "DEFAULT_TIMEOUT_S",
]

#: Seconds one malformed call may run before its worker is killed.
DEFAULT_TIMEOUT_S = 60.0
#: Seconds past a call's own timeout the parent waits for the fork server before giving it up.
GRACE_S = 30.0
_SERVER = "hetero_conformance._forkserver"


@dataclass
class RobustnessResult:
    """A finished tier: the mode, the worker costs and one result per call, in catalog order."""

    validate: bool
    timeout_s: float
    startup_s: float = 0.0
    calls: list[CallResult] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Calls per status (every status present), and ``failed``: the calls that do not pass."""
        counts = dict.fromkeys(STATUSES, 0)
        for c in self.calls:
            counts[c.status] = counts.get(c.status, 0) + 1
        return {**counts, "failed": sum(not c.ok for c in self.calls)}

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.calls)

    @property
    def per_call_s(self) -> float:
        """Mean wall seconds per call: fork, backend load, drawing, the call and the reaping."""
        return sum(c.seconds for c in self.calls) / len(self.calls) if self.calls else 0.0

    def as_dict(self) -> dict[str, Any]:
        summary = {"total": len(self.calls), **self.counts(), "ok": self.ok}
        return {
            "validate": self.validate,
            "timeout_s": self.timeout_s,
            "startup_s": round(self.startup_s, 3),
            "per_call_s": round(self.per_call_s, 4),
            "summary": summary,
            "calls": [c.as_dict() for c in self.calls],
        }


def select_calls(
    calls: Iterable[Malformed], *, ops: Sequence[str] = (), patterns: Sequence[str] = ()
) -> list[Malformed]:
    """The calls of ``ops`` (empty: all) whose id matches one of ``patterns`` (as the catalog's ``-k``)."""
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        raise SelectionError(f"unknown op(s) {', '.join(unknown)}; ops: {', '.join(OPS)}")
    return [c for c in calls if (not ops or c.op in ops) and (not patterns or any(matches(c.id, p) for p in patterns))]


def _run_forked(
    config: dict[str, Any],
    calls: Sequence[Malformed],
    *,
    on_start: Callable[[Malformed], None],
    on_result: Callable[[CallResult], None],
) -> tuple[float, list[CallResult]]:
    """Run ``calls`` through one fork server; returns (its start-up seconds, results in order)."""
    pending = {c.id: c for c in calls}
    results: dict[str, CallResult] = {}
    launched = time.monotonic()
    startup = [0.0]

    def on_message(msg: dict[str, Any]) -> float:
        if msg.get("event") == "ready":
            startup[0] = time.monotonic() - launched  # interpreter, imports, plugins, catalog
        return time.monotonic() + config["timeout"] + GRACE_S  # the server kills a call at its timeout itself

    def collect(result: CallResult) -> None:
        results[result.id] = result
        on_result(result)

    with Worker({**config, "ids": list(pending)}, _SERVER) as worker:
        lost = drive(
            worker,
            pending,
            CallResult,
            deadline=launched + STARTUP_S,
            on_message=on_message,
            on_start=on_start,
            on_result=collect,
        )
        if lost is not None:
            status, current = lost
            why = (
                f"the fork server died: {worker.death()}"
                if status == "crashed"
                else f"the fork server stopped answering ({'on ' + current if current else 'at start-up'})"
            )
            for cid, call in pending.items():
                note = why if cid == current or current is None else f"not run: the fork server was lost on {current}"
                collect(CallResult.of(call, status, note, validate=config["validate"]))
    return startup[0], [results[c.id] for c in calls]


def run_robustness(
    name: str,
    calls: Sequence[Malformed],
    *,
    validate: bool = True,
    seed: int = 0,
    timeout: float = DEFAULT_TIMEOUT_S,
    catalog: str = DEFAULT,
    on_start: Callable[[Malformed], None] = lambda c: None,
    on_result: Callable[[CallResult], None] = lambda r: None,
) -> RobustnessResult:
    """Run ``calls`` on backend ``name`` (loaded by name from the installed plugins with ``validate``),
    each in its own forked worker; results in the given order."""
    result = RobustnessResult(validate=validate, timeout_s=timeout)
    config = {"backend": name, "validate": validate, "seed": seed, "catalog": catalog, "timeout": timeout}
    result.startup_s, result.calls = _run_forked(config, list(calls), on_start=on_start, on_result=on_result)
    return result


def selected_calls(selection: Any) -> list[Malformed]:
    """The calls of ``selection``'s catalog (its ``catalog``, or the built-in one), filtered by its ops and patterns."""
    ref = DEFAULT if selection.catalog == DEFAULT_CATALOG else selection.catalog
    return select_calls(load_calls(ref), ops=selection.ops, patterns=selection.patterns)


def run_robustness_suite(
    registry: Any,
    name: str,
    selection: Any,
    *,
    validate: bool = True,
    seed: int = 0,
    timeout: float = DEFAULT_TIMEOUT_S,
    console: Any = None,
    argv: Sequence[str] | None = None,
) -> Any:
    """The robustness tier as a SuiteResult (no numeric cases; ``robustness`` holds the calls),
    with a progress bar on ``console`` (None: silent). Raises SelectionError and the registry's errors."""
    calls = selected_calls(selection)
    ops = registry.load(name, validate=validate)  # usage errors (unknown, unavailable) here, not in a worker
    meta = build_meta(
        registry, name, ops.device, seed=seed, selection=selection, isolate=True, timeout=timeout, argv=argv
    )
    suite = SuiteResult(meta)
    catalog = DEFAULT if selection.catalog == DEFAULT_CATALOG else selection.catalog
    start = time.perf_counter()
    with progress(console, len(calls)) as (started, finished):
        suite.robustness = run_robustness(
            name,
            calls,
            validate=validate,
            seed=seed,
            timeout=timeout,
            catalog=catalog,
            on_start=started,
            on_result=finished,
        )
    meta["run"]["duration_s"] = round(time.perf_counter() - start, 3)
    return suite
