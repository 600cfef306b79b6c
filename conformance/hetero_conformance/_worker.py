"""The worker-process protocol ``--isolate`` and ``--robustness`` share.

The parent starts ``python -m MODULE`` (:class:`Worker`, a ``_spawn.Child`` that
reads protocol lines) and writes its config as JSON on stdin. The worker
(:class:`Channel`) reports one JSON line per event on its protocol channel, each
prefixed with :data:`MARK`: ``ready``, then ``start`` (with ``id``) and ``result``
(with ``result``, a dict) per item. Anything else it prints goes to stderr, which
the parent keeps to quote when the worker dies. :func:`drive` is the parent's
message loop. Starting, killing and describing the process is ``_spawn``'s.
"""

from __future__ import annotations

import json
import os
import queue
from typing import Any, Callable

from hetero_conformance._spawn import EOF, MARK, Child, child_env, gist

__all__ = ["STARTUP_S", "MARK", "EOF", "child_env", "gist", "Worker", "Channel", "drive"]

#: Seconds a worker may take to import and load the backend before its first case starts.
STARTUP_S = 120.0


class Worker(Child):
    """One protocol worker (``python -m module``): its messages arrive on a queue, its stderr in a temporary file.

    A context manager: leaving it kills the worker if it still runs."""

    def __init__(self, config: dict[str, Any], module: str):
        super().__init__(module, config, messages=True)


class Channel:
    """The worker's side: protocol lines go to the process's stdout as it was; fd 1 becomes stderr,
    so whatever else the process prints (Python or C) stays off the protocol."""

    def __init__(self) -> None:
        self._out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
        os.dup2(2, 1)

    def emit(self, event: str, **payload: Any) -> None:
        """Send one protocol line: ``{"event": event, **payload}``."""
        self._out.write(MARK + json.dumps({"event": event, **payload}) + "\n")
        self._out.flush()

    def fileno(self) -> int:
        """The protocol channel's descriptor (a forked child closes it)."""
        return self._out.fileno()


def drive(
    worker: Worker,
    pending: dict[str, Any],
    result_type: Callable[..., Any],
    *,
    deadline: float,
    on_message: Callable[[dict[str, Any]], float | None],
    on_start: Callable[[Any], None],
    on_result: Callable[[Any], None],
) -> tuple[str, str | None] | None:
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
