"""The benchmark baseline format shared by ``hetero bench`` (ops) and ``hetero bench-engine``.

A baseline is one JSON file::

    {
      "schema": "hetero-bench-baseline/1",
      "kind": "ops",                       # or "engine", "serve"
      "created": "2026-12-01T10:00:00+00:00",
      "command": "hetero bench cpu_ref --shapes quick --save b.json",
      "environment": {"backend": "cpu_ref", "device": "cpu", "python": "3.11.9",
                      "platform": "Linux-...", "versions": {"torch": "2.13.0", "hetero": "0.1.0", ...}},
      "metrics": [{"name": "gemm/perf/qwen3-8b-qkv/float32", "value": 0.0123, "unit": "s",
                   "higher_is_better": false, "samples": [0.0121, 0.0123, 0.0130]}]
    }

The environment is the key: a baseline of another backend or device cannot be
compared with (:func:`check_environment` returns the error); differing library
versions only warn.

:func:`compare` pairs metrics by name. A metric on one side only is reported as
a :class:`Comparison` with ``regressed=False``, ``nan`` on the missing side and
a ``note`` saying which side lacks it, so a renamed or new case never crashes a
comparison nor fails it silently. :func:`confirm` re-judges a regression after
the caller re-measured it, so one noisy sample does not fail CI.
"""

from __future__ import annotations

import json
import math
import platform
import statistics
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping, Sequence

from hetero.errors import UsageError

__all__ = [
    "SCHEMA",
    "KINDS",
    "Metric",
    "Comparison",
    "BaselineError",
    "environment",
    "save_baseline",
    "load_baseline",
    "check_environment",
    "compare",
    "confirm",
]

SCHEMA = "hetero-bench-baseline/1"
KINDS = ("ops", "engine", "serve")
_CORE_PACKAGES = ("torch", "triton", "hetero")


@dataclass(frozen=True)
class Metric:
    """One measured number: ``value`` is what is compared (ops: the median time in seconds)."""

    name: str
    value: float
    unit: str
    higher_is_better: bool = False
    samples: tuple[float, ...] = ()


@dataclass(frozen=True)
class Comparison:
    """A current metric against its baseline.

    ``change`` is the relative change in the bad direction: +0.25 means 25%
    worse (25% slower for times, 25% lower for throughputs); negative is better.
    ``spread`` is (min, median, max) of the re-measurements when :func:`confirm`
    re-judged it. ``note`` explains a metric present on one side only.
    """

    name: str
    baseline: float
    current: float
    change: float
    regressed: bool
    spread: tuple[float, float, float] | None = None
    note: str = ""


class BaselineError(UsageError):
    """A baseline file that cannot be used: missing, not JSON, another schema or kind, or malformed.

    A :class:`hetero.errors.UsageError` (and so a ValueError): the ``hetero`` command prints it as one line, exit 2.
    """


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def environment(backend: str, device: str, packages: Mapping[str, str] | None = None) -> dict:
    """The key of a baseline: backend, device, library versions, Python and platform.

    ``packages`` adds versions the caller knows (e.g. the backend's package);
    torch, triton (when installed) and hetero are looked up here.
    """
    versions = {name: v for name in _CORE_PACKAGES if (v := _version(name)) is not None}
    versions.update(packages or {})
    return {
        "backend": backend,
        "device": device,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": dict(sorted(versions.items())),
    }


def save_baseline(path: str | Path, kind: str, env: dict, metrics: Sequence[Metric], command: str) -> None:
    """Write ``metrics`` measured in ``env`` as a baseline of ``kind`` (one of ``KINDS``)."""
    if kind not in KINDS:
        raise BaselineError(f"baseline kind must be one of {', '.join(KINDS)}, not {kind!r}")
    names = [m.name for m in metrics]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise BaselineError(f"duplicate metric names: {', '.join(duplicates)}")
    doc = {
        "schema": SCHEMA,
        "kind": kind,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "environment": env,
        "metrics": [dict(asdict(m), samples=list(m.samples)) for m in metrics],
    }
    Path(path).write_text(json.dumps(doc, indent=2) + "\n")


def _metric(raw: Any, path: Path) -> Metric:
    try:
        return Metric(
            name=str(raw["name"]),
            value=float(raw["value"]),
            unit=str(raw["unit"]),
            higher_is_better=bool(raw.get("higher_is_better", False)),
            samples=tuple(float(s) for s in raw.get("samples", ())),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise BaselineError(f"{path}: malformed metric {raw!r}: {e}") from None


def load_baseline(path: str | Path, kind: str) -> tuple[dict, dict[str, Metric]]:
    """Read a baseline of ``kind``: (environment, metrics by name). :class:`BaselineError` if unusable."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise BaselineError(f"no baseline at {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BaselineError(f"{path} is not a readable JSON baseline: {e}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise BaselineError(f"{path}: schema {found!r} is not {SCHEMA!r}")
    if doc.get("kind") != kind:
        raise BaselineError(f"{path} is a baseline of kind {doc.get('kind')!r}, expected {kind!r}")
    env, raw_metrics = doc.get("environment"), doc.get("metrics")
    if not isinstance(env, dict) or not isinstance(raw_metrics, list):
        raise BaselineError(f"{path}: 'environment' must be an object and 'metrics' a list")
    metrics = [_metric(m, path) for m in raw_metrics]
    return env, {m.name: m for m in metrics}


def check_environment(saved: dict, current: dict) -> tuple[str | None, list[str]]:
    """(error, warnings): an error when backend or device differ, a warning per differing version."""
    for key in ("backend", "device"):
        if saved.get(key) != current.get(key):
            return (
                f"the baseline was measured with {key} {saved.get(key)!r}, this run uses "
                f"{current.get(key)!r}: compare against a baseline of the same {key}"
            ), []
    warnings = []
    old, new = saved.get("versions", {}), current.get("versions", {})
    for name in sorted(set(old) | set(new)):
        if old.get(name) != new.get(name):
            warnings.append(f"{name} {old.get(name) or 'absent'} in the baseline, {new.get(name) or 'absent'} now")
    if saved.get("python") != current.get("python"):
        warnings.append(f"python {saved.get('python')} in the baseline, {current.get('python')} now")
    return None, warnings


def _change(baseline: float, current: float, higher_is_better: bool) -> float:
    if baseline == 0:
        return 0.0 if current == baseline else (-math.inf if higher_is_better == (current > 0) else math.inf)
    delta = (baseline - current) if higher_is_better else (current - baseline)
    return delta / abs(baseline)


def compare(saved: Mapping[str, Metric], current: Sequence[Metric], threshold: float) -> list[Comparison]:
    """Each current metric against its baseline, in the current order, then baseline-only metrics.

    A metric regresses when its ``change`` exceeds ``threshold`` (0.1 = 10% worse).
    A unit that differs between the two sides is a :class:`BaselineError`.
    """
    out = []
    for m in current:
        old = saved.get(m.name)
        if old is None:
            out.append(Comparison(m.name, math.nan, m.value, math.nan, False, note="not in the baseline"))
            continue
        if old.unit != m.unit or old.higher_is_better != m.higher_is_better:
            raise BaselineError(f"metric {m.name}: baseline unit {old.unit!r} differs from {m.unit!r}")
        change = _change(old.value, m.value, m.higher_is_better)
        out.append(Comparison(m.name, old.value, m.value, change, change > threshold))
    names = {m.name for m in current}
    out += [
        Comparison(n, old.value, math.nan, math.nan, False, note="not measured in this run")
        for n, old in saved.items()
        if n not in names
    ]
    return out


def confirm(
    comparison: Comparison, repeats: Sequence[float], threshold: float, higher_is_better: bool = False
) -> Comparison:
    """Re-judge a comparison with re-measured values: the best of them (and the first) is kept.

    The spread (min, median, max) covers the first measurement and the repeats;
    the result regresses only if even the best value is worse than ``threshold``.
    """
    pool = [comparison.current, *repeats]
    best = max(pool) if higher_is_better else min(pool)
    change = _change(comparison.baseline, best, higher_is_better)
    spread = (min(pool), statistics.median(pool), max(pool))
    return replace(comparison, current=best, change=change, regressed=change > threshold, spread=spread)
