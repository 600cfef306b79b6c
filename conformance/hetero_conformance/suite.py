"""Selects conformance cases, runs them against one backend (in process or isolated) and describes the run."""

from __future__ import annotations

import datetime
import importlib
import importlib.metadata as md
import platform
import shlex
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import torch

from hetero.backend import Availability
from hetero.registry import REFERENCE, Registry
from hetero.spec import OPS, SPEC_VERSION
from hetero.verify.case import DTYPES, Case
from hetero_conformance._isolate import run_isolated
from hetero_conformance._progress import progress
from hetero_conformance._selectors import matches
from hetero_conformance._version import __version__
from hetero_conformance.runner import FAILING, STATUSES, CaseResult, Runner

__all__ = [
    "DEFAULT_CATALOG",
    "Selection",
    "SuiteResult",
    "SelectionError",
    "load_catalog",
    "select",
    "selected_cases",
    "run_cases",
    "build_meta",
    "run_suite",
]

#: ``module:function`` of the case catalog; the function takes ``quick=`` and returns a list of Case.
DEFAULT_CATALOG = "hetero_conformance.cases:catalog"

OnCase = Callable[[Case], None]
OnResult = Callable[[CaseResult], None]


class SelectionError(ValueError):
    """An unknown op or dtype in a selector, or a catalog that cannot be loaded."""


@dataclass(frozen=True)
class Selection:
    """Which cases run: the tier, then ``ops``/``dtypes`` (empty: all) and ``-k`` patterns (any may match).

    ``robustness``: the malformed-call tier instead of the numeric catalog (``catalog``
    then names a malformed-call catalog; see ``hetero_conformance.robustness``)."""

    quick: bool = False
    ops: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()
    catalog: str = DEFAULT_CATALOG
    robustness: bool = False

    @property
    def tier(self) -> str:
        return "robustness" if self.robustness else "quick" if self.quick else "full"

    def as_dict(self) -> dict[str, Any]:
        return {
            "ops": list(self.ops),
            "dtypes": list(self.dtypes),
            "patterns": list(self.patterns),
            "catalog": self.catalog,
        }


@dataclass
class SuiteResult:
    """A finished run: the report's metadata and one result per selected case, in catalog order;
    ``robustness`` holds the malformed-call tier when it ran."""

    meta: dict[str, Any]
    results: list[CaseResult] = field(default_factory=list)
    robustness: Any = None

    def counts(self) -> dict[str, int]:
        """The number of cases per status (every status present, zero when none)."""
        counts = dict.fromkeys(STATUSES, 0)
        for r in self.results:
            counts[r.status] = counts.get(r.status, 0) + 1
        return counts

    @property
    def ok(self) -> bool:
        """True unless a case failed, errored, crashed or timed out, or a malformed call did not pass."""
        return not any(r.status in FAILING for r in self.results) and (self.robustness is None or self.robustness.ok)


def load_catalog(ref: str, *, quick: bool) -> list[Case]:
    """The cases of catalog ``module:function`` (the function is called with ``quick=``)."""
    module, _, func = ref.partition(":")
    try:
        fn = getattr(importlib.import_module(module), func or "catalog")
    except (ImportError, AttributeError) as e:
        raise SelectionError(f"cannot load the case catalog '{ref}': {e}") from e
    return list(fn(quick=quick))


def select(
    cases: Iterable[Case], *, ops: Sequence[str] = (), dtypes: Sequence[str] = (), patterns: Sequence[str] = ()
) -> list[Case]:
    """The cases whose op is in ``ops``, dtype in ``dtypes`` (empty: any) and id matches one of
    ``patterns`` (a glob when it has ``*?[``, else a substring; none: every id)."""
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        raise SelectionError(f"unknown op(s) {', '.join(unknown)}; ops: {', '.join(OPS)}")
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise SelectionError(f"unknown dtype(s) {', '.join(bad)}; dtypes: {', '.join(DTYPES)}")
    return [
        c
        for c in cases
        if (not ops or c.op in ops)
        and (not dtypes or c.dtype in dtypes)
        and (not patterns or any(matches(c.id, p) for p in patterns))
    ]


def selected_cases(selection: Selection) -> list[Case]:
    """The catalog's cases of ``selection``'s tier, filtered by its selectors."""
    cases = load_catalog(selection.catalog, quick=selection.quick)
    return select(cases, ops=selection.ops, dtypes=selection.dtypes, patterns=selection.patterns)


def run_cases(
    runner: Runner, cases: Iterable[Case], *, on_start: OnCase | None = None, on_result: OnResult | None = None
) -> list[CaseResult]:
    """Run ``cases`` one after the other; an exception escaping the runner is the case's error."""
    results = []
    for case in cases:
        if on_start is not None:
            on_start(case)
        try:
            result = runner.run(case)
        except Exception as e:  # e.g. a supports() that raises: the case errs, the run goes on
            result = CaseResult.of(
                case, "error", f"the runner raised {type(e).__name__}: {e}", seed=case.seed(runner.seed)
            )
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            continue
    return None


def _driver_version(avail: Availability, device: torch.device) -> str | None:
    for key in ("driver", "driver_version"):
        if key in avail.details:
            return str(avail.details[key])
    if device.type == "cuda" and torch.cuda.is_available():
        try:
            return str(torch._C._cuda_getDriverVersion())
        except Exception:  # not every build exposes it
            return None
    return None


def environment(avail: Availability, device: torch.device) -> dict[str, Any]:
    """Python, platform, torch, triton (never imported), CUDA/HIP toolkits and the driver."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "triton": _dist_version("triton", "pytorch-triton-rocm", "pytorch-triton-xpu", "pytorch-triton"),
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "driver": _driver_version(avail, device),
    }


def build_meta(
    registry: Registry,
    name: str,
    device: torch.device,
    *,
    seed: int,
    selection: Selection,
    isolate: bool,
    timeout: float | None,
    argv: Sequence[str] | None = None,
    world_size: int = 1,
) -> dict[str, Any]:
    """Everything about a run but its results: versions, backend, device, environment, selectors."""
    base = name.split(":")[0]
    entry, avail = registry.entry(base), registry.availability(base)
    plugin = registry.plugins.get(entry.plugin)
    return {
        "spec_version": SPEC_VERSION,
        "tool": {"hetero": _dist_version("hetero"), "hetero_conformance": __version__},
        "backend": {
            "name": name,
            "package": plugin.dist if plugin is not None else "",
            "version": entry.version,
            "spec_version": getattr(entry.cls, "spec_version", None),
            "device": str(device),
            "device_name": avail.device_name,
            "details": {str(k): str(v) for k, v in dict(avail.details).items()},
        },
        "environment": environment(avail, device),
        "run": {
            "seed": seed,
            "tier": selection.tier,
            "selection": selection.as_dict(),
            "isolate": isolate,
            "world_size": world_size,
            "timeout_s": timeout if isolate or world_size > 1 else None,
            "command": shlex.join(["hetero", "conformance", *argv]) if argv is not None else shlex.join(sys.argv),
            "started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "duration_s": 0.0,
        },
    }


def run_suite(
    registry: Registry,
    name: str,
    selection: Selection,
    *,
    seed: int = 0,
    isolate: bool = False,
    timeout: float = 300.0,
    console: Any = None,
    argv: Sequence[str] | None = None,
) -> SuiteResult:
    """Run the selected cases against backend ``name`` with a progress bar on ``console`` (None: silent).

    Raises SelectionError, and the registry's BackendNotFound/Unavailable/Incompatible.
    ``isolate`` runs each op family in a worker process (see ``hetero_conformance._isolate``).
    """
    cases = selected_cases(selection)
    ops = registry.load(name)
    suite = SuiteResult(
        build_meta(
            registry, name, ops.device, seed=seed, selection=selection, isolate=isolate, timeout=timeout, argv=argv
        )
    )
    start = time.perf_counter()
    with progress(console, len(cases)) as (started, finished):
        if isolate:
            suite.results = run_isolated(
                name,
                cases,
                seed=seed,
                timeout=timeout,
                catalog=selection.catalog,
                quick=selection.quick,
                on_start=started,
                on_result=finished,
            )
        else:
            runner = Runner(ops, registry.entry(REFERENCE).cls(), seed=seed)
            suite.results = run_cases(runner, cases, on_start=started, on_result=finished)
    suite.meta["run"]["duration_s"] = round(time.perf_counter() - start, 3)
    return suite
