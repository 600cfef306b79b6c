"""``--isolate``: each op family runs in its own worker process, so a crash or a hang is a verdict.

The parent starts ``python -m hetero_conformance._isolate`` per family and sends
it the backend name, seed, catalog and case ids as JSON on stdin. The worker
loads the backend by name from the installed entry points (the parent's
``sys.path`` is its ``PYTHONPATH``), rebuilds the cases from the catalog and
reports, one line each on its protocol channel, ``ready``, then ``start`` and
``result`` per case. Anything else the backend prints goes to stderr, which the
parent keeps to quote when the worker dies.

- The worker dies (segfault, ``abort``, ``exit``): the case it had started is
  ``crashed`` with the signal or exit code and the end of its stderr; the
  family's cases it never reached are ``crashed`` too ("not run").
- A case runs longer than ``timeout`` seconds: the worker is killed, that case
  and the family's remaining ones are ``timeout``. Starting up (imports, loading
  the backend) is allowed ``max(timeout, STARTUP_S)``.

The other families run regardless.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Iterable

from hetero_conformance.case import Case
from hetero_conformance.runner import CaseResult

__all__ = ["run_isolated", "STARTUP_S"]

#: Seconds a worker may take to import and load the backend before its first case starts.
STARTUP_S = 120.0
_MARK = "\x1ehetero-conformance:"
_EOF = object()


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env["PYTHONFAULTHANDLER"] = "1"  # a segfault or abort prints the Python stack to stderr
    return env


class _Worker:
    """One worker process (``python -m module``): its protocol lines arrive on a queue, its stderr in a temporary file."""

    def __init__(self, config: dict[str, Any], module: str = "hetero_conformance._isolate"):
        self.stderr = tempfile.TemporaryFile()
        cmd = [sys.executable, "-m", module]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, env=_child_env(), text=True)
        self.messages: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(config))
            self.proc.stdin.close()
        except OSError:  # it died before reading: the exit status tells why
            pass

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(_MARK):
                try:
                    self.messages.put(json.loads(line[len(_MARK):]))
                except ValueError:
                    continue
        self.messages.put(_EOF)

    def next(self, deadline: float) -> Any:
        """The next message, ``_EOF`` once the worker closed its output, or queue.Empty past ``deadline``."""
        return self.messages.get(timeout=max(0.0, deadline - time.monotonic()))

    def stop(self) -> None:
        """Kill the worker if it still runs, and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def death(self) -> str:
        """How the worker ended: the signal or exit code, then the end of its stderr."""
        rc = self.proc.wait()
        how = f"exit code {rc}"
        if rc < 0:
            try:
                how = f"{signal.Signals(-rc).name} (exit {rc})"
            except ValueError:
                how = f"signal {-rc}"
        self.stderr.seek(0)
        gist = _gist(self.stderr.read().decode(errors="replace"))
        self.stderr.close()
        return how + (": " + " | ".join(gist) if gist else "")


def _gist(stderr: str) -> list[str]:
    """The lines of a dead worker's stderr that say why: faulthandler's error and innermost frames, else the tail."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if line.startswith("Fatal Python error"):
            frames = [f for f in lines[i + 1:] if f.startswith("File ")]
            return [line] + frames[:4]
    return lines[-8:]


def _verdicts(pending: dict[str, Case], current: str | None, status: str, why: str, family: str, seed: int) -> list[CaseResult]:
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


def _run_family(family: str, cases: list[Case], config: dict[str, Any], timeout: float,
                on_start: Callable[[Case], None], on_result: Callable[[CaseResult], None]) -> None:
    pending = {c.id: c for c in cases}
    worker = _Worker({**config, "ids": list(pending)})
    current, deadline, started = None, time.monotonic() + max(timeout, STARTUP_S), 0.0
    try:
        while pending:
            try:
                msg = worker.next(deadline)
            except queue.Empty:
                worker.stop()
                status = "timeout"
                why = (f"killed after {time.monotonic() - started:.0f} s on this case (--timeout {timeout:g})" if current
                       else f"no case started within {max(timeout, STARTUP_S):g} s")
                break
            if msg is _EOF:
                status, why = "crashed", f"the worker process died: {worker.death()}"
                break
            if msg.get("event") == "start" and msg.get("id") in pending:
                current, started, deadline = msg["id"], time.monotonic(), time.monotonic() + timeout
                on_start(pending[current])
            elif msg.get("event") == "result":
                result = CaseResult(**msg["result"])
                if pending.pop(result.id, None) is not None:
                    current = None
                    on_result(result)
        else:
            return
        for result in _verdicts(pending, current, status, why, family, config["seed"]):
            on_result(result)
    finally:
        worker.stop()


def run_isolated(name: str, cases: Iterable[Case], *, seed: int, timeout: float, catalog: str, quick: bool,
                 on_start: Callable[[Case], None] = lambda c: None,
                 on_result: Callable[[CaseResult], None] = lambda r: None) -> list[CaseResult]:
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


# -- the worker side ---------------------------------------------------------------------------
def _worker_main() -> int:
    channel = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # whatever the backend prints (Python or C) goes to stderr, not the protocol

    def emit(event: str, **payload: Any) -> None:
        channel.write(_MARK + json.dumps({"event": event, **payload}) + "\n")
        channel.flush()

    config = json.loads(sys.stdin.read())
    from hetero.registry import REFERENCE, default_registry
    from hetero_conformance.runner import Runner
    from hetero_conformance.suite import load_catalog, run_cases

    registry = default_registry()
    ops = registry.load(config["backend"])
    runner = Runner(ops, registry.entry(REFERENCE).cls(), seed=config["seed"])
    by_id = {c.id: c for c in load_catalog(config["catalog"], quick=config["quick"])}
    emit("ready")
    for cid in config["ids"]:
        case = by_id.get(cid)
        if case is None:
            emit("result", result={"id": cid, "op": cid.split("/")[0], "family": "", "shape": "", "dtype": "", "status": "error",
                                   "message": f"the worker's catalog {config['catalog']} has no case {cid}"})
            continue
        run_cases(runner, [case], on_start=lambda c: emit("start", id=c.id), on_result=lambda r: emit("result", result=r.as_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main())
