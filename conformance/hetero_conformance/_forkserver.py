"""The robustness tier's workers: one forked process per malformed call, from a pre-imported server.

Starting ``python -c "import torch, triton"`` per call would cost about a second
each; instead the parent starts ``python -m hetero_conformance._forkserver``
once (config as JSON on stdin, as ``--isolate`` does). The server imports torch,
hetero, the installed plugins, the catalog and, for a Triton backend, Triton
and its kernel modules; it runs no tensor op and starts no thread, so forking
it is safe. Then, per call, it forks a child that loads the backend by name,
draws the call's inputs, makes the call, writes its verdict to a pipe and exits.
The server reports ``ready``, then ``start`` and ``result`` per call on its
protocol channel:

- the child dies (signal, exit code): ``crashed``, with the end of its stderr;
- it runs past ``timeout`` seconds: it is killed, ``timeout``; the run goes on.

Nothing forked ever touches an accelerator before the fork: each child
initializes its own device context.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import tempfile
import threading
import time
from typing import Any, NoReturn, Sequence

from hetero_conformance._attempt import CallResult, attempt, load_calls
from hetero_conformance._spawn import exit_text
from hetero_conformance._worker import Channel, gist
from hetero_conformance.cases.malformed import Malformed

__all__ = ["main"]

#: A child's exit code when it could not make the call at all (its traceback is in its stderr).
_SETUP_FAILED = 70


def _preload(config: dict[str, Any]) -> tuple[Any, dict[str, Malformed]]:
    """Import everything a child needs, once: torch, hetero, the plugins, the catalog, Triton."""
    import importlib

    import torch.distributed  # noqa: F401  (the ep calls' one-rank group)

    from hetero.kernels import TritonBackend
    from hetero.registry import Registry

    registry = Registry()
    cls = registry.entry(config["backend"].split(":")[0]).cls
    if cls is not None and issubclass(cls, TritonBackend):
        try:
            from hetero.kernels import triton_modules

            triton_modules()
            for family in ("attention", "cache", "gemm", "moe", "layers"):
                importlib.import_module(f"hetero.kernels.{family}")
        except Exception:  # the child's load reports why, call by call
            pass
    return registry, {c.id: c for c in load_calls(config["catalog"])}


def _collect(fd: int, deadline: float) -> tuple[bytes, bool]:
    """Everything written to pipe ``fd`` until it closes (True) or ``deadline`` passes (False)."""
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return b"".join(chunks), False
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks), True
            chunks.append(chunk)


def _die_with_server() -> None:
    """Linux: the child is killed when the server goes (a hung call must not outlive the run)."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def _child(
    registry: Any, call: Malformed, config: dict[str, Any], out_fd: int, log_fd: int, close: Sequence[int]
) -> NoReturn:
    code = 0
    try:
        _die_with_server()
        for fd in close:
            os.close(fd)
        os.dup2(log_fd, 1)  # whatever the backend prints goes to the call's log, never the protocol
        os.dup2(log_fd, 2)
        import torch

        torch.set_num_threads(1)  # tiny shapes: an intra-op thread pool per child would cost more than it saves
        ops = registry.load(config["backend"], validate=config["validate"])
        os.write(out_fd, json.dumps(attempt(ops, call, seed=config["seed"]).as_dict()).encode())
    except BaseException:
        import traceback

        traceback.print_exc()
        code = _SETUP_FAILED
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _fork_call(registry: Any, call: Malformed, config: dict[str, Any], channel_fd: int) -> CallResult:
    start, validate = time.monotonic(), config["validate"]
    read_fd, write_fd = os.pipe()
    with tempfile.TemporaryFile() as log:
        pid = os.fork()
        if pid == 0:
            _child(registry, call, config, write_fd, log.fileno(), (read_fd, channel_fd))
        os.close(write_fd)
        data, finished = _collect(read_fd, start + config["timeout"])
        os.close(read_fd)
        if not finished:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        seconds = time.monotonic() - start
        try:
            result = CallResult(**json.loads(data))
            result.seconds = seconds
            return result
        except (ValueError, TypeError):  # no verdict (or half of one): the child died or hung
            pass
        if not finished:
            return CallResult.of(
                call,
                "timeout",
                f"killed after {seconds:.0f} s (--timeout {config['timeout']:g})",
                validate=validate,
                seconds=seconds,
            )
        log.seek(0)
        lines = gist(log.read().decode(errors="replace"))
        why = f"the worker process died: {exit_text(os.waitstatus_to_exitcode(status))}" + (
            ": " + " | ".join(lines) if lines else ""
        )
        return CallResult.of(call, "crashed", why, validate=validate, seconds=seconds)


def main() -> int:
    """Serve the calls the config on stdin names, one forked child each; 0 once every one has its verdict."""
    channel = Channel()
    config = json.loads(sys.stdin.read())
    registry, calls = _preload(config)
    channel.emit("ready", threads=threading.active_count())
    for cid in config["ids"]:
        channel.emit("start", id=cid)
        call = calls.get(cid)
        if call is None:
            raise SystemExit(f"hetero_conformance._forkserver: the catalog {config['catalog']} has no call {cid}")
        channel.emit("result", result=_fork_call(registry, call, config, channel.fileno()).as_dict())
    return 0


if __name__ == "__main__":
    sys.exit(main())
