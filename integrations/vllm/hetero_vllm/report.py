"""The routing report: which vLLM layer class each hetero op served, and how many calls.

Every routed call increments ``counts[(vllm_class, hetero_op)]`` from inside the
op's ``torch.library.custom_op`` body, so the count is of calls that really ran
(compiled graphs included), not of Python forwards traced once. Classes left on
vLLM's own kernels are listed in ``not_routed`` with the reason.

With ``HETERO_VLLM_REPORT=path.json`` each process merges its counts into that
file at exit (under a lock on the file, so workers exiting together merge). The JSON::

    {"backend": "cpu_ref",
     "platform": "hetero_vllm._cpu_platform.HeteroCpuPlatform",  # null unless on hetero's platform plugin
     "routed": {"RMSNorm": {"rms_norm": 120, "rms_norm+residual": 96}, ...},
     "not_routed": {"Llama4VisionRotaryEmbedding": "overrides forward: ...", ...},
     "processes": 2,
     "writers": [{"pid": 4242, "process": "MainProcess", "calls": 0}, ...]}
"""

from __future__ import annotations

import atexit
import fcntl
import json
import multiprocessing
import multiprocessing.util
import os
import threading
from collections import Counter
from pathlib import Path
from typing import Any

__all__ = ["REPORT_ENV", "record", "not_routed", "set_backend", "set_platform", "snapshot", "reset", "write", "read"]

#: The environment variable naming the JSON file each process merges its counts into.
REPORT_ENV = "HETERO_VLLM_REPORT"

_lock = threading.Lock()
_counts: Counter[tuple[str, str]] = Counter()
_not_routed: dict[str, str] = {}
_backend: list[str] = []
_platform: list[str] = []
_atexit_armed = False


def record(vllm_class: str, op: str) -> None:
    """Count one call of hetero op ``op`` serving vLLM layer class ``vllm_class``."""
    with _lock:
        _counts[(vllm_class, op)] += 1


def not_routed(vllm_class: str, reason: str) -> None:
    """Note that ``vllm_class`` keeps vLLM's kernel, and why."""
    with _lock:
        _not_routed.setdefault(vllm_class, reason)


def set_backend(name: str) -> None:
    """Record the hetero backend this process loaded (for the report's ``backend`` field)."""
    _backend[:] = [name]


def set_platform(qualname: str) -> None:
    """Record the vLLM platform class this process runs on, when it is hetero's (the report's ``platform``)."""
    _platform[:] = [qualname]


def snapshot() -> dict[str, Any]:
    """This process's report as a JSON-ready dict (see the module docstring)."""
    with _lock:
        routed: dict[str, dict[str, int]] = {}
        for (cls, op), n in sorted(_counts.items()):
            routed.setdefault(cls, {})[op] = n
        skipped = {c: r for c, r in sorted(_not_routed.items()) if c not in routed}
        writer = {"pid": os.getpid(), "process": multiprocessing.current_process().name, "calls": sum(_counts.values())}
    return {
        "backend": _backend[0] if _backend else None,
        "platform": _platform[0] if _platform else None,
        "routed": routed,
        "not_routed": skipped,
        "processes": 1,
        "writers": [writer],
    }


def reset() -> None:
    """Forget every count and note (tests)."""
    with _lock:
        _counts.clear()
        _not_routed.clear()


def _merge(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    routed = {c: dict(ops) for c, ops in old.get("routed", {}).items()}
    for cls, ops in new["routed"].items():
        for op, n in ops.items():
            routed.setdefault(cls, {})[op] = routed.get(cls, {}).get(op, 0) + n
    skipped = {**old.get("not_routed", {}), **new["not_routed"]}
    return {
        "backend": new["backend"] or old.get("backend"),
        "platform": new.get("platform") or old.get("platform"),
        "routed": routed,
        "not_routed": {c: r for c, r in sorted(skipped.items()) if c not in routed},
        "processes": old.get("processes", 0) + 1,
        "writers": old.get("writers", []) + new["writers"],
    }


def write(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Merge this process's counts into the JSON file at ``path`` (created if absent); returns the merged report."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # workers of one run exit together
        f.seek(0)
        text = f.read()
        merged = _merge(json.loads(text) if text.strip() else {}, snapshot())
        f.seek(0)
        f.truncate()
        f.write(json.dumps(merged, indent=2, sort_keys=True) + "\n")
    return merged


def read(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The report at ``path``."""
    return json.loads(Path(path).read_text())


_written: list[bool] = []


def _write_at_exit() -> None:
    path = os.environ.get(REPORT_ENV)
    if path and (_counts or _not_routed) and not _written:
        _written.append(True)
        write(path)


def arm_at_exit() -> None:
    """Once per process: write the report at exit when ``HETERO_VLLM_REPORT`` is set."""
    global _atexit_armed
    if not _atexit_armed:
        _atexit_armed = True
        atexit.register(_write_at_exit)
        # a forked worker leaves through os._exit, which skips atexit; multiprocessing runs its finalizers
        multiprocessing.util.Finalize(None, _write_at_exit, exitpriority=0)
