"""The parent's side of ``--world-size``: every rank's JSON records merged into one CaseResult per case.

A case every rank finished fails if any rank did not pass it (naming the ranks); a case some
rank never finished is ``crashed`` or ``timeout``, with the reason of each missing rank.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from hetero.verify.tolerances import EXACT, tolerance
from hetero_conformance._dist_case import DistCase
from hetero_conformance._spawn import signal_name
from hetero_conformance.runner import CaseResult

__all__ = ["read_records", "merge", "ended"]


def _result(case: DistCase, status: str, message: str = "", seed: int = 0, **kw: Any) -> CaseResult:
    return CaseResult(case.id, case.op, case.family, case.shape, case.dtype, status, message, seed, **kw)


def read_records(path: Path) -> list[dict[str, Any]]:
    """The JSON records of one rank's file (none when it is missing; a line cut by a crash is dropped)."""
    if not path.exists():
        return []
    recs = []
    for line in path.read_text().splitlines():
        try:
            recs.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a crash
            pass
    return recs


def _finished(case: DistCase, recs: list[dict[str, Any]], seed: int) -> CaseResult:
    """The verdict on a case every rank finished: skipped by all, else failing if any rank did not pass."""
    if all(rec["status"] == "skipped" for rec in recs):
        return _result(case, "skipped", recs[0]["message"], case.seed(seed))
    bad = [(r, rec) for r, rec in enumerate(recs) if rec["status"] != "pass"]
    outputs = {f"rank{r}.{k}": v for r, rec in enumerate(recs) for k, v in rec["outputs"].items()}
    seconds = max(rec["seconds"] for rec in recs)
    tol = (
        tolerance(case.dtype).as_dict()
        if outputs and any(v.get("kind") == "float" for v in outputs.values())
        else (EXACT.as_dict() if outputs else {})
    )
    if bad:
        status = "error" if any(rec["status"] == "error" for _, rec in bad) else "fail"
        message = "; ".join(f"rank {r}: {rec['message']}" for r, rec in bad)
    else:
        status, message = "pass", ""
    return _result(case, status, message, case.seed(seed), seconds=seconds, outputs=outputs, tolerance=tol)


def _why_missing(where: str, abort: str, exit: int | None, r: int, stderr: Sequence[str] = ()) -> str:
    if abort:
        return f"rank {r} aborted {where}: {abort}"
    if exit is None:
        return f"rank {r} did not finish {where} (killed after the timeout)"
    if exit != 0:
        code = signal_name(-exit) if exit < 0 else f"exit code {exit}"
        quote = ": " + " | ".join(stderr) if stderr and where == "in this case" else ""
        return f"rank {r} died ({code}) {where}{quote}"
    return f"rank {r} exited {where}"


def merge(
    cases: list[DistCase],
    per_rank: list[list[dict[str, Any]]],
    exits: list[int | None],
    timed_out: bool,
    seed: int,
    stderr: Sequence[Sequence[str]] = (),
) -> list[CaseResult]:
    """One CaseResult per case from every rank's records; ``stderr``: the gist of each rank's stderr (spawned ranks)."""
    world = len(per_rank)
    stderr = list(stderr) or [()] * world
    done = [{r["id"]: r for r in recs if r.get("event") == "done"} for recs in per_rank]
    started = [{r["id"] for r in recs if r.get("event") == "start"} for recs in per_rank]
    aborts = [next((r["message"] for r in recs if r.get("event") == "abort"), "") for recs in per_rank]
    results = []
    for case in cases:
        recs = [d.get(case.id) for d in done]
        if all(recs):
            results.append(_finished(case, recs, seed))
            continue
        missing = [r for r in range(world) if not recs[r]]
        why = [
            _why_missing(
                "in this case" if case.id in started[r] else "before this case", aborts[r], exits[r], r, stderr[r]
            )
            for r in missing
        ]
        status = (
            "timeout"
            if timed_out and any(exits[r] is None for r in missing) and not any(aborts[r] for r in missing)
            else "crashed"
        )
        results.append(_result(case, status, "; ".join(why), case.seed(seed)))
    return results


def ended(path: Path) -> bool:
    """Whether the rank that wrote ``path`` recorded its end (or its abort)."""
    return any(r.get("event") in ("end", "abort") for r in read_records(path))
