"""The one spawner of the conformance suite: start worker processes, watch them, kill them, say how they ended.

Every runner that leaves the parent's process goes through :class:`Child`:
``--isolate`` (a worker per op family), ``--robustness`` (the fork server) and
``--world-size N`` (a process per rank). A child is ``python -m MODULE`` with

* the environment of :func:`child_env`: the parent's, its ``sys.path`` as
  ``PYTHONPATH`` (so plugins and catalogs the parent can import are found by
  name), faulthandler on, plus the caller's variables;
* its config as JSON on stdin (then stdin is closed);
* stdout either read on a thread for protocol lines (``messages=True``: lines
  prefixed with :data:`MARK` are parsed onto :attr:`Child.messages`, ``EOF`` ends
  them) or, for children that report through files, sent to the log;
* stderr in a temporary file, quoted by :meth:`Child.death` when the child dies.

:func:`watch` waits on a group of children that write progress somewhere the
parent can measure, stopping the wait at a stall or when one of them dies;
:func:`stop_all` kills what still runs and collects the exit codes.
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
from typing import Any, Callable, Mapping, Sequence

__all__ = ["MARK", "EOF", "child_env", "gist", "signal_name", "exit_text", "Child", "watch", "stop_all"]

#: Prefixes each protocol line (a record separator: no backend prints it by accident).
MARK = "\x1ehetero-conformance:"
#: What :meth:`Child.next` returns once the child closed its output.
EOF = object()
_POLL_S = 0.05
#: Seconds :func:`stop_all` waits for a killed child to be reaped.
_REAP_S = 5.0


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child: this process's, ``sys.path`` as ``PYTHONPATH``, faulthandler on, then ``extra``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env["PYTHONFAULTHANDLER"] = "1"  # a segfault or abort prints the Python stack to stderr
    env.update(extra or {})
    return env


def gist(stderr: str) -> list[str]:
    """The lines of a dead child's stderr that say why: faulthandler's error and innermost frames, else the tail."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if line.startswith("Fatal Python error"):
            frames = [f for f in lines[i + 1 :] if f.startswith("File ")]
            return [line] + frames[:4]
    return lines[-8:]


def signal_name(num: int) -> str:
    """``SIGSEGV`` for 11; ``signal N`` for a number no signal has."""
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def exit_text(rc: int) -> str:
    """How a process with return code ``rc`` ended: ``exit code 7``, ``SIGABRT (exit -6)``, ``signal 99``."""
    if rc >= 0:
        return f"exit code {rc}"
    name = signal_name(-rc)
    return name if name.startswith("signal ") else f"{name} (exit {rc})"


class Child:
    """One child process, ``python -m module``, given ``config`` as JSON on stdin.

    ``messages``: read stdout for protocol lines (see the module docstring); else stdout
    joins stderr in the log. ``env``: variables on top of :func:`child_env`. A context
    manager: leaving it kills the child if it still runs.
    """

    def __init__(self, module: str, config: Any, *, messages: bool = True, env: Mapping[str, str] | None = None):
        self.module = module
        self.log = tempfile.TemporaryFile()
        self.killed = False
        self.messages: queue.Queue = queue.Queue()
        self._death: str | None = None
        out = subprocess.PIPE if messages else self.log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=self.log,
            env=child_env(env),
            text=True,
        )
        if messages:
            threading.Thread(target=self._read, daemon=True).start()
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(config))
            self.proc.stdin.close()
        except OSError:  # it died before reading: the exit status tells why
            pass

    def __enter__(self) -> "Child":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(MARK):
                try:
                    self.messages.put(json.loads(line[len(MARK) :]))
                except ValueError:
                    continue
        self.messages.put(EOF)

    def next(self, deadline: float) -> Any:
        """The next message, ``EOF`` once the child closed its output, or queue.Empty past ``deadline``."""
        return self.messages.get(timeout=max(0.0, deadline - time.monotonic()))

    def poll(self) -> int | None:
        """The return code, None while the child runs."""
        return self.proc.poll()

    def kill(self) -> None:
        """Kill the child if it still runs (without waiting for it)."""
        if self.proc.poll() is None:
            self.killed = True
            self.proc.kill()

    def stop(self) -> None:
        """Kill the child if it still runs, and reap it."""
        self.kill()
        self.proc.wait()

    def stderr_gist(self) -> list[str]:
        """:func:`gist` of what the child wrote to its log (read it once the child ended: the child
        shares the file's offset)."""
        self.log.seek(0)
        return gist(self.log.read().decode(errors="replace"))

    def death(self) -> str:
        """How the child ended: :func:`exit_text` of its return code, then the gist of its stderr (waits for it)."""
        if self._death is None:
            lines = self.stderr_gist() if not self.log.closed else []
            self._death = exit_text(self.proc.wait()) + (": " + " | ".join(lines) if lines else "")
            self.close()
        return self._death

    def close(self) -> None:
        """Drop the log (its temporary file)."""
        self.log.close()


def watch(
    children: Sequence[Child], progress: Callable[[], int], *, timeout: float, grace: float = 0.0, linger: float = 5.0
) -> bool:
    """Wait while ``children`` run; True when ``progress()`` stood still for ``timeout`` seconds (plus
    ``grace`` before it first moved past 0: start-up). When one child ends with a non-zero code the others
    get ``min(linger, timeout)`` seconds to end too, then the wait stops (False), as it does when all ended."""
    last, seen = time.monotonic(), -1
    while any(c.poll() is None for c in children):
        now = progress()
        if now != seen:
            seen, last = now, time.monotonic()
        elif time.monotonic() - last > timeout + (grace if seen <= 0 else 0.0):
            return True
        if any(c.poll() not in (None, 0) for c in children):  # one died: give the others a moment, then stop
            deadline = time.monotonic() + min(linger, timeout)
            while time.monotonic() < deadline and any(c.poll() is None for c in children):
                time.sleep(_POLL_S)
            return False
        time.sleep(_POLL_S)
    return False


def stop_all(children: Sequence[Child]) -> list[int | None]:
    """Kill the children that still run and reap them; their return codes (None: not reaped in time)."""
    for c in children:
        c.kill()
    codes: list[int | None] = []
    for c in children:
        try:
            codes.append(c.proc.wait(_REAP_S))
        except subprocess.TimeoutExpired:
            codes.append(None)
    return codes
