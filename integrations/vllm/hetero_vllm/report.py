"""The routing report: which vLLM layer class each hetero op served, and how many calls.

Every routed instance (a layer, quant method or attention impl) takes a call site
(``site("RMSNorm")`` gives ``"RMSNorm#3"``), and every routed call increments
``counts[(site, hetero_op)]`` from inside the op's ``torch.library.custom_op`` body,
so the count is of calls that really ran (compiled graphs included), not of Python
forwards traced once. ``routed`` sums the sites by class; ``instances`` says how many
were built and how many called hetero at least once. ``not_routed`` lists, by class,
what this process built that keeps vLLM's path (``census``) and routed instances that
never called hetero, each with the reason.

With ``HETERO_VLLM_REPORT=path.json`` each process merges its counts into that
file at exit (under a lock on the file, so workers exiting together merge). The JSON::

    {"backend": "cpu_ref",
     "platform": "hetero_vllm._cpu_platform.HeteroCpuPlatform",  # null unless on hetero's platform plugin
     "routed": {"RMSNorm": {"rms_norm": 120, "rms_norm+residual": 96}, ...},
     "instances": {"RMSNorm": {"built": 5, "called": 5}, ...},
     "not_routed": {"VocabParallelEmbedding": "an embedding lookup, not a GEMM: no hetero op", ...},
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
from typing import Any, Callable

__all__ = [
    "REPORT_ENV",
    "site",
    "withdraw",
    "record",
    "not_routed",
    "forget",
    "on_snapshot",
    "set_backend",
    "set_platform",
    "snapshot",
    "reset",
    "write",
    "read",
]

#: The environment variable naming the JSON file each process merges its counts into.
REPORT_ENV = "HETERO_VLLM_REPORT"

_lock = threading.Lock()
_counts: Counter[tuple[str, str]] = Counter()
_built: Counter[str] = Counter()
_before_snapshot: list[Callable[[], None]] = []
_not_routed: dict[str, str] = {}
_backend: list[str] = []
_platform: list[str] = []
_atexit_armed = False


def site(vllm_class: str) -> str:
    """A new call site for one built instance of ``vllm_class`` (``"RMSNorm#3"``): the routed layer, method or
    attention impl keeps it as ``hetero_site`` and passes it to its ``torch.ops.hetero`` calls. An instance whose
    site never records a call shows in ``not_routed`` (a model calling ``forward_native`` directly, say)."""
    with _lock:
        index = _built[vllm_class]
        _built[vllm_class] += 1
    return f"{vllm_class}#{index}"


def withdraw(call_site: str | None) -> None:
    """Take back a site from ``site()``: its instance turned out to keep vLLM's path (it notes why itself)."""
    if call_site:
        with _lock:
            _built[call_site.split("#", 1)[0]] -= 1


def record(call_site: str, op: str) -> None:
    """Count one call of hetero op ``op`` at ``call_site`` (from ``site()``, or a bare vLLM class name)."""
    with _lock:
        _counts[(call_site, op)] += 1


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


def forget(classes: set[str]) -> None:
    """Drop the ``not_routed`` notes of ``classes`` (the census found them routed after all)."""
    with _lock:
        for name in classes:
            _not_routed.pop(name, None)


def on_snapshot(fn: Callable[[], None]) -> None:
    """Call ``fn`` before each snapshot (the census re-classifies what is still alive)."""
    if fn not in _before_snapshot:
        _before_snapshot.append(fn)


def _by_class() -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]], dict[str, str]]:
    """(routed ops per class, built/called instances per class, notes on instances that never called hetero)."""
    routed: dict[str, dict[str, int]] = {}
    called: dict[str, set[str]] = {}
    for (where, op), n in sorted(_counts.items()):
        cls = where.split("#", 1)[0]
        routed.setdefault(cls, {})[op] = routed.get(cls, {}).get(op, 0) + n
        called.setdefault(cls, set()).add(where)
    instances = {cls: {"built": n, "called": len(called.get(cls, ()))} for cls, n in sorted(_built.items())}
    idle = {
        cls: f"{c['built'] - c['called']} of {c['built']} built instances never called hetero "
        "(vLLM took another path: forward_native called directly, the weight read directly as MLA's kv_b_proj is, "
        "or the layer never ran)"
        for cls, c in instances.items()
        if c["called"] < c["built"]
    }
    return routed, instances, idle


def snapshot() -> dict[str, Any]:
    """This process's report as a JSON-ready dict (see the module docstring)."""
    for fn in list(_before_snapshot):
        fn()
    with _lock:
        routed, instances, idle = _by_class()
        skipped = dict(sorted({**_not_routed, **idle}.items()))
        writer = {"pid": os.getpid(), "process": multiprocessing.current_process().name, "calls": sum(_counts.values())}
    return {
        "backend": _backend[0] if _backend else None,
        "platform": _platform[0] if _platform else None,
        "routed": routed,
        "instances": instances,
        "not_routed": skipped,
        "processes": 1,
        "writers": [writer],
    }


def reset() -> None:
    """Forget every count and note (tests)."""
    with _lock:
        _counts.clear()
        _built.clear()
        _not_routed.clear()


def _merge(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    routed = {c: dict(ops) for c, ops in old.get("routed", {}).items()}
    for cls, ops in new["routed"].items():
        for op, n in ops.items():
            routed.setdefault(cls, {})[op] = routed.get(cls, {}).get(op, 0) + n
    instances = {c: dict(v) for c, v in old.get("instances", {}).items()}
    for cls, counts in new["instances"].items():
        mine = instances.setdefault(cls, {"built": 0, "called": 0})
        for key, n in counts.items():
            mine[key] += n
    skipped = {**old.get("not_routed", {}), **new["not_routed"]}
    return {
        "backend": new["backend"] or old.get("backend"),
        "platform": new.get("platform") or old.get("platform"),
        "routed": routed,
        "instances": dict(sorted(instances.items())),
        "not_routed": dict(sorted(skipped.items())),
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
    if path and (_counts or _not_routed or _built) and not _written:
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
