"""What the serving benchmarks share: ``hetero serve`` and vllm-router processes, used once /health answers, and
stopped at the end."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

__all__ = ["ROUTER", "healthy", "wait_up", "stopping"]

ROUTER = shutil.which("vllm-router") or str(Path(sys.executable).with_name("vllm-router"))


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def wait_up(proc: subprocess.Popen, url: str, seconds: float) -> None:
    """Until ``url``/health answers; RuntimeError with the end of the process's output when it exits or
    ``seconds`` pass (a process still running is killed first, so its output can be read to the end)."""
    deadline = time.monotonic() + seconds
    while not healthy(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            pipe = proc.stdout or proc.stderr
            log = pipe.read()[-3000:] if pipe is not None else ""
            raise RuntimeError(f"{' '.join(map(str, proc.args))} did not come up: {log}")
        time.sleep(0.3)


@contextlib.contextmanager
def stopping(seconds: float = 60) -> Iterator[list[subprocess.Popen]]:
    """A list to append processes to as they start; on exit each is terminated and waited for."""
    procs: list[subprocess.Popen] = []
    try:
        yield procs
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(seconds)
