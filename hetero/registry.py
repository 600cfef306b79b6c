"""Plugin discovery (pluggy over the ``hetero.backends`` entry points) and backend selection."""

from __future__ import annotations

import difflib
import functools
import importlib.metadata as md
import os
import re
import warnings
from typing import Iterable, Mapping

import pluggy
import torch

import hetero.hookspecs as hookspecs  # the submodule itself, not the package namespace that imports this one
from hetero._plugins import BackendEntry, PluginLoader, PluginRecord
from hetero.backend import Availability, Backend
from hetero.errors import BackendIncompatible, BackendNotFound, BackendUnavailable
from hetero.ops import Binding, Ops
from hetero.spec.validate import default_validate

__all__ = ["Registry", "BackendEntry", "PluginRecord", "default_registry", "load", "REFERENCE", "ENTRY_POINT_GROUP"]

ENTRY_POINT_GROUP = "hetero.backends"
REFERENCE = "cpu_ref"
_NAME_WITH_INDEX = re.compile(r"^(?P<name>[A-Za-z0-9_.\-]+?)(?::(?P<index>\d+))?$")


class Registry:
    """The set of installed hetero plugins and the backends they provide.

    Discovery runs once, on first use. ``entry_points`` replaces the installed
    entry points (tests pass their own); ``env`` replaces os.environ for the
    allow/block lists and ``HETERO_BACKEND``.
    """

    def __init__(self, *, entry_points: Iterable[md.EntryPoint] | None = None, env: Mapping[str, str] | None = None):
        self._env = env if env is not None else os.environ
        self._explicit_eps = list(entry_points) if entry_points is not None else None
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self._loader = PluginLoader(self.pm, self._env)
        self._discovered = False

    # -- discovery -----------------------------------------------------------------
    def _discover(self) -> None:
        if self._discovered:
            return
        self._discovered = True
        eps = self._explicit_eps if self._explicit_eps is not None else md.entry_points(group=ENTRY_POINT_GROUP)
        for ep in sorted(eps, key=lambda e: (e.name, e.value)):  # a stable order whatever sys.path holds
            self._loader.load_entry_point(ep)

    def register(self, plugin: object, name: str, *, version: str = "in-process") -> PluginRecord:
        """Register a plugin object or module in this process (tests, notebooks, embedded plugins)."""
        self._discover()
        return self._loader.register(plugin, name, dist=name, version=version)

    @property
    def plugins(self) -> dict[str, PluginRecord]:
        self._discover()
        return dict(self._loader.records)

    @property
    def backends(self) -> dict[str, BackendEntry]:
        """Every backend name known, including those of broken or incompatible plugins."""
        self._discover()
        return dict(self._loader.backends)

    def names(self) -> list[str]:
        return sorted(self.backends)

    # -- selection ------------------------------------------------------------------
    def entry(self, name: str) -> BackendEntry:
        entries = self.backends
        if name not in entries:
            close = difflib.get_close_matches(name, list(entries), n=1, cutoff=0.5)
            raise BackendNotFound(name, sorted(entries), close[0] if close else None)
        return entries[name]

    def availability(self, name: str) -> Availability:
        """The probe's answer for ``name``; a broken plugin or a raising probe is unavailable with the reason."""
        entry = self.entry(name)
        if entry.cls is None or entry.status != "ok":
            return Availability(ok=False, reason=f"{entry.status}: {entry.problem}")
        try:
            result = entry.cls.probe()
        except Exception as e:  # a probe must not raise; if it does, the backend is simply unavailable
            return Availability(ok=False, reason=f"probe raised {type(e).__name__}: {e}")
        if not isinstance(result, Availability):
            return Availability(ok=False, reason=f"probe returned {type(result).__name__}, not Availability")
        return result

    def select(self) -> str:
        """The name ``load()`` uses with no argument: HETERO_BACKEND, else the best available backend."""
        env_name = self._env.get("HETERO_BACKEND", "").strip()
        if env_name:
            return env_name
        ranked = sorted(
            (e for e in self.backends.values() if e.cls is not None and e.status == "ok"),
            key=lambda e: (-e.cls.priority, e.name),
        )
        for e in ranked:
            if self.availability(e.name).ok:
                return e.name
        raise BackendUnavailable(
            "(auto)", f"no installed backend is available; known: {', '.join(self.names()) or 'none'}"
        )

    def overrides(self, backend_name: str) -> dict[str, Binding]:
        """Op implementations other plugins add to ``backend_name`` (later registrations win)."""
        return self._loader.overrides(backend_name)

    def load(
        self,
        name: str | None = None,
        *,
        device: torch.device | str | None = None,
        strict: bool = False,
        validate: bool | None = None,
    ) -> Ops:
        """The op table of backend ``name`` (``"cuda:1"`` selects device index 1); see hetero.load."""
        name = name if name is not None else self.select()
        match = _NAME_WITH_INDEX.match(name.strip())
        base = match.group("name") if match else name
        entry = self.entry(base)
        if entry.status == "incompatible":
            raise BackendIncompatible(base, entry.problem)
        avail = self.availability(base)
        if not avail.ok:
            raise BackendUnavailable(base, avail.reason)
        for w in entry.warnings:
            warnings.warn(f"hetero backend '{base}': {w}", stacklevel=3)
        assert entry.cls is not None
        if device is None and match and match.group("index") is not None:
            device = torch.device(entry.cls.device_type, int(match.group("index")))
        backend = entry.cls(device)
        backend.validate = default_validate(backend.device, self._env) if validate is None else bool(validate)
        return Ops(backend, self._reference(base, backend.device), self.overrides(base), strict=strict)

    def inspect(self, name: str) -> tuple[Ops | None, Availability]:
        """For reports: the op table of ``name`` and its availability, even when it cannot run here.

        An unavailable backend is built on the "meta" device (no allocation, no
        vendor runtime) so its native and fallback ops can still be listed; a broken
        one has no table.
        """
        entry = self.entry(name)
        avail = self.availability(name)
        if entry.cls is None:
            return None, avail
        if avail.ok:
            return self.load(name), avail
        backend = entry.cls(torch.device("meta"))
        return Ops(backend, self._reference(name, backend.device), self.overrides(name)), avail

    def _reference(self, name: str, device: torch.device) -> Backend | None:
        if name == REFERENCE:
            return None
        ref = self.backends.get(REFERENCE)
        if ref is None or ref.cls is None or ref.status != "ok":
            return None
        return ref.cls(device)


@functools.lru_cache(maxsize=None)
def default_registry() -> Registry:
    """The process's registry over the installed entry points, discovered once (per process)."""
    return Registry()


def load(
    name: str | None = None,
    *,
    device: torch.device | str | None = None,
    strict: bool = False,
    validate: bool | None = None,
) -> Ops:
    """Select a backend and return its op table.

    ``name`` comes from the argument, else ``HETERO_BACKEND``, else the available
    backend of highest priority (the reference ``cpu_ref`` last); ``"cuda:1"``
    picks a device index. Raises BackendNotFound for an unknown name (listing the
    known ones and the closest), BackendUnavailable with the probe's reason, and
    BackendIncompatible for a spec major-version mismatch. Ops the backend lacks
    resolve to the reference (reported by ``ops.explain()``), or with
    ``strict=True`` raise OpNotAvailable when called.

    ``validate`` turns on the checks that read index tensors' contents (block ids,
    slots, positions, cumulative lengths, group ends, expert ids; see
    ``hetero.spec.validate``): every malformed call then raises OpError naming the op
    and the argument. None takes ``HETERO_VALIDATE`` (1/0), else on for a backend on
    CPU tensors and off on an accelerator, where each check costs a device-to-host
    sync. Shape, dtype and device checks are always on.
    """
    return default_registry().load(name, device=device, strict=strict, validate=validate)
