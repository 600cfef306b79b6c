"""The worker-process protocol ``--isolate`` and ``--robustness`` share.

The parent starts ``python -m MODULE`` (:class:`Worker`) and writes its config as
JSON on stdin. The worker (:class:`Channel`) reports one JSON line per event on
its protocol channel, each prefixed with :data:`MARK`: ``ready``, then ``start``
(with ``id``) and ``result`` (with ``result``, a dict) per item. Anything else
it prints goes to stderr, which the parent keeps to quote when the worker dies.
:func:`drive` is the parent's message loop.
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
from typing import Any, Callable

__all__ = ["STARTUP_S", "MARK", "EOF", "child_env", "gist", "Worker", "Channel", "drive"]

#: Seconds a worker may take to import and load the backend before its first case starts.
STARTUP_S = 120.0
#: Prefixes each protocol line (a record separator: no backend prints it by accident).
MARK = "\x1ehetero-conformance:"
#: What :meth:`Worker.next` returns once the worker closed its output.
EOF = object()


def child_env() -> dict[str, str]:
    """The environment of a worker: this process's ``sys.path`` as its ``PYTHONPATH``, faulthandler on."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env["PYTHONFAULTHANDLER"] = "1"  # a segfault or abort prints the Python stack to stderr
    return env


def gist(stderr: str) -> list[str]:
    """The lines of a dead worker's stderr that say why: faulthandler's error and innermost frames, else the tail."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if line.startswith("Fatal Python error"):
            frames = [f for f in lines[i + 1:] if f.startswith("File ")]
            return [line] + frames[:4]
    return lines[-8:]


class Worker:
    """One worker process (``python -m module``): its protocol lines arrive on a queue, its stderr in a temporary file.

    A context manager: leaving it kills the worker if it still runs."""

    def __init__(self, config: dict[str, Any], module: str):
        self.stderr = tempfile.TemporaryFile()
        cmd = [sys.executable, "-m", module]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, env=child_env(), text=True)
        self.messages: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(config))
            self.proc.stdin.close()
        except OSError:  # it died before reading: the exit status tells why
            pass

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(MARK):
                try:
                    self.messages.put(json.loads(line[len(MARK):]))
                except ValueError:
                    continue
        self.messages.put(EOF)

    def next(self, deadline: float) -> Any:
        """The next message, ``EOF`` once the worker closed its output, or queue.Empty past ``deadline``."""
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
        lines = gist(self.stderr.read().decode(errors="replace"))
        self.stderr.close()
        return how + (": " + " | ".join(lines) if lines else "")


class Channel:
    """The worker's side: protocol lines go to the process's stdout as it was; fd 1 becomes stderr,
    so whatever else the process prints (Python or C) stays off the protocol."""

    def __init__(self) -> None:
        self._out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
        os.dup2(2, 1)

    def emit(self, event: str, **payload: Any) -> None:
        self._out.write(MARK + json.dumps({"event": event, **payload}) + "\n")
        self._out.flush()

    def fileno(self) -> int:
        return self._out.fileno()


def drive(worker: Worker, pending: dict[str, Any], result_type: Callable[..., Any], *, deadline: float,
          on_message: Callable[[dict[str, Any]], float | None], on_start: Callable[[Any], None],
          on_result: Callable[[Any], None]) -> tuple[str, str | None] | None:
    """Read ``worker``'s messages until every item of ``pending`` (by id) has its result: None.

    Each result (``result_type(**msg["result"])``) leaves ``pending`` and goes to ``on_result``;
    ``on_start`` gets the item a ``start`` names. ``on_message`` sees every message first and returns
    the next deadline (None: keep ``deadline``). A lost worker returns ``(status, id it was on or None)``:
    ``timeout`` past the deadline (the worker is killed), ``crashed`` when it closed its output.
    """
    current = None
    while pending:
        try:
            msg = worker.next(deadline)
        except queue.Empty:
            worker.stop()
            return "timeout", current
        if msg is EOF:
            return "crashed", current
        deadline = on_message(msg) or deadline
        if msg.get("event") == "start" and msg.get("id") in pending:
            current = msg["id"]
            on_start(pending[current])
        elif msg.get("event") == "result":
            result = result_type(**msg["result"])
            if pending.pop(result.id, None) is not None:
                current = None
                on_result(result)
    return None
