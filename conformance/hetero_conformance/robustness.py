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

import importlib
import re
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import torch

from hetero.errors import HeteroError

from hetero_conformance.cases.malformed import DEFAULT, Malformed

__all__ = ["STATUSES", "CallResult", "RobustnessResult", "load_calls", "select_calls", "attempt",
           "one_rank_comm", "run_robustness", "selected_calls", "run_robustness_suite", "DEFAULT_TIMEOUT_S"]

STATUSES = ("rejected", "silent", "unclear", "crashed", "timeout", "fallback")
#: Seconds one malformed call may run before its worker is killed.
DEFAULT_TIMEOUT_S = 60.0


@dataclass
class CallResult:
    """The verdict on one malformed call."""

    id: str
    op: str
    family: str
    defect: str
    arg: str
    index: bool
    status: str
    ok: bool
    message: str = ""
    seconds: float = 0.0

    @classmethod
    def of(cls, call: Malformed, status: str, message: str, *, validate: bool, seconds: float = 0.0) -> "CallResult":
        return cls(call.id, call.op, call.family, call.defect, call.arg, call.index, status,
                   acceptable(status, call.index, validate), message, seconds)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def acceptable(status: str, index: bool, validate: bool) -> bool:
    """Whether ``status`` passes: rejected or fallback; silent too for an index defect with validation off.
    unclear, crashed and timeout fail in either mode."""
    return status in ("rejected", "fallback") or (status == "silent" and index and not validate)


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
        return {"validate": self.validate, "timeout_s": self.timeout_s, "startup_s": round(self.startup_s, 3),
                "per_call_s": round(self.per_call_s, 4), "summary": summary, "calls": [c.as_dict() for c in self.calls]}


def load_calls(ref: str = DEFAULT) -> list[Malformed]:
    """The calls of catalog ``module:function`` (the function takes no argument)."""
    from hetero_conformance.suite import SelectionError

    module, _, func = ref.partition(":")
    try:
        fn = getattr(importlib.import_module(module), func or "catalog")
    except (ImportError, AttributeError) as e:
        raise SelectionError(f"cannot load the malformed-call catalog '{ref}': {e}") from e
    return list(fn())


def select_calls(calls: Iterable[Malformed], *, ops: Sequence[str] = (), patterns: Sequence[str] = ()) -> list[Malformed]:
    """The calls of ``ops`` (empty: all) whose id matches one of ``patterns`` (as the catalog's ``-k``)."""
    from hetero.spec import OPS
    from hetero_conformance.suite import SelectionError, _matches

    unknown = [op for op in ops if op not in OPS]
    if unknown:
        raise SelectionError(f"unknown op(s) {', '.join(unknown)}; ops: {', '.join(OPS)}")
    return [c for c in calls if (not ops or c.op in ops) and (not patterns or any(_matches(c.id, p) for p in patterns))]


def one_rank_comm(ops: Any) -> Any:
    """A communicator over a one-rank process group of the backend's process-group backend (ep ops)."""
    import torch.distributed as dist

    from hetero.distributed import TorchCommunicator

    if not dist.is_initialized():
        if ops.device.type != "cpu" and hasattr(getattr(torch, ops.device.type, None), "set_device"):
            getattr(torch, ops.device.type).set_device(ops.device)
        pg = type(ops.backend).process_group_backend()
        dist.init_process_group(backend=pg, store=dist.HashStore(), rank=0, world_size=1)
    return TorchCommunicator(None, timeout=30.0)


def _text(e: BaseException) -> str:
    return traceback.format_exception_only(type(e), e)[-1].strip()


def _classify(call: Malformed, error: BaseException | None, validate: bool) -> tuple[str, str]:
    if error is None:
        mode = "validation on" if validate else "validation off"
        return "silent", f"returned normally ({mode}): the malformed '{call.arg}' was not rejected"
    if isinstance(error, HeteroError) and re.search(rf"\b{re.escape(call.op)}\b", str(error)):  # "gemm" is not named by "grouped_gemm"
        return "rejected", _text(error)
    if isinstance(error, HeteroError):
        return "unclear", f"a hetero error that does not name the op '{call.op}': {_text(error)}"
    return "unclear", f"raised {_text(error)} (expected hetero.OpError naming '{call.op}')"


def attempt(ops: Any, call: Malformed, *, seed: int = 0) -> CallResult:
    """Make one malformed call on ``ops`` in this process and classify its outcome (a forked
    worker runs this: a backend that crashes takes only the worker down)."""
    validate = bool(ops.validate)
    start = time.perf_counter()
    binding, _ = ops.native(call.op)
    if binding is None:
        return CallResult.of(call, "fallback", "the op is not native: the reference ran, nothing of the backend was tested", validate=validate)
    try:
        draw = call.draw(seed, ops.device, ops, lambda: one_rank_comm(ops))
        args = call.inputs(draw)
    except Exception as e:
        return CallResult.of(call, "unclear", f"drawing the call failed (its valid half did not run): {_text(e)}", validate=validate)
    from hetero_conformance.runner import call as bind_call

    error: BaseException | None = None
    try:
        bind_call(getattr(ops, call.op), call.op, args)
        if ops.device.type != "cpu" and hasattr(torch, "accelerator"):
            torch.accelerator.synchronize()  # an asynchronous device fault surfaces here, inside the call
    except Exception as e:
        error = e
    status, message = _classify(call, error, validate)
    return CallResult.of(call, status, message, validate=validate, seconds=time.perf_counter() - start)


def run_robustness(name: str, calls: Sequence[Malformed], *, validate: bool = True, seed: int = 0,
                   timeout: float = DEFAULT_TIMEOUT_S, catalog: str = DEFAULT,
                   on_start: Callable[[Malformed], None] = lambda c: None,
                   on_result: Callable[[CallResult], None] = lambda r: None) -> RobustnessResult:
    """Run ``calls`` on backend ``name`` (loaded by name from the installed plugins with ``validate``),
    each in its own forked worker; results in the given order."""
    from hetero_conformance._forkserver import run_forked

    result = RobustnessResult(validate=validate, timeout_s=timeout)
    config = {"backend": name, "validate": validate, "seed": seed, "catalog": catalog, "timeout": timeout}
    result.startup_s, result.calls = run_forked(config, list(calls), on_start=on_start, on_result=on_result)
    return result


def selected_calls(selection: Any) -> list[Malformed]:
    """The calls of ``selection``'s catalog (its ``catalog``, or the built-in one), filtered by its ops and patterns."""
    from hetero_conformance.suite import DEFAULT_CATALOG

    ref = DEFAULT if selection.catalog == DEFAULT_CATALOG else selection.catalog
    return select_calls(load_calls(ref), ops=selection.ops, patterns=selection.patterns)


def run_robustness_suite(registry: Any, name: str, selection: Any, *, validate: bool = True, seed: int = 0,
                         timeout: float = DEFAULT_TIMEOUT_S, console: Any = None, argv: Sequence[str] | None = None) -> Any:
    """The robustness tier as a SuiteResult (no numeric cases; ``robustness`` holds the calls),
    with a progress bar on ``console`` (None: silent). Raises SelectionError and the registry's errors."""
    from hetero_conformance.suite import DEFAULT_CATALOG, SuiteResult, _progress, build_meta

    calls = selected_calls(selection)
    ops = registry.load(name, validate=validate)  # usage errors (unknown, unavailable) here, not in a worker
    meta = build_meta(registry, name, ops.device, seed=seed, selection=selection, isolate=True, timeout=timeout, argv=argv)
    suite = SuiteResult(meta)
    catalog = DEFAULT if selection.catalog == DEFAULT_CATALOG else selection.catalog
    start = time.perf_counter()
    with _progress(console, len(calls)) as (started, finished):
        suite.robustness = run_robustness(name, calls, validate=validate, seed=seed, timeout=timeout, catalog=catalog,
                                          on_start=started, on_result=finished)
    meta["run"]["duration_s"] = round(time.perf_counter() - start, 3)
    return suite
