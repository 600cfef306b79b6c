"""Guarded plugin loading: one plugin's failure is recorded and never reaches the others."""

from __future__ import annotations

import importlib.metadata as md
import traceback
from dataclasses import dataclass, field
from typing import Mapping

import pluggy

from hetero.backend import Backend
from hetero.ops import Binding
from hetero.spec import OPS, SPEC_VERSION

__all__ = ["PluginRecord", "BackendEntry", "PluginLoader"]


@dataclass
class PluginRecord:
    """One plugin as loaded: status "loaded", "broken" or "disabled", with the error when not loaded."""

    name: str
    dist: str
    version: str
    status: str = "loaded"
    error: str = ""
    traceback: str = ""
    problems: list[str] = field(default_factory=list)  # non-fatal: bad overrides, say


@dataclass
class BackendEntry:
    """A backend as discovered: its class (None when its plugin failed), plugin, version, state."""

    name: str
    cls: type[Backend] | None
    plugin: str
    version: str
    problem: str = ""  # why it cannot be used, when status is not "ok"
    status: str = "ok"  # "ok", "broken", "disabled" or "incompatible"
    warnings: list[str] = field(default_factory=list)


def _split_env(env: Mapping[str, str], key: str) -> set[str]:
    return {p.strip() for p in env.get(key, "").split(",") if p.strip()}


def _version_problem(cls: type[Backend]) -> tuple[str, str]:
    """(status, message) of a backend's declared spec version against this hetero's."""
    declared = str(getattr(cls, "spec_version", "") or "")
    try:
        major, minor = (int(p) for p in declared.split(".")[:2])
    except ValueError:
        return "incompatible", f"declares spec_version {declared!r}; expected a version like '{SPEC_VERSION}'"
    our_major, our_minor = (int(p) for p in SPEC_VERSION.split(".")[:2])
    if major != our_major:
        return (
            "incompatible",
            f"implements spec {declared} but this hetero provides spec {SPEC_VERSION} (major versions differ); "
            "upgrade the one that is older",
        )
    if minor != our_minor:
        return (
            "warn",
            f"implements spec {declared}, this hetero provides {SPEC_VERSION}; "
            "ops of the newer minor version are missing on one side",
        )
    return "ok", ""


class PluginLoader:
    """Loads entry points and in-process plugins into one pluggy PluginManager, each inside try/except."""

    def __init__(self, pm: pluggy.PluginManager, env: Mapping[str, str]):
        self.pm = pm
        self.allow = _split_env(env, "HETERO_PLUGINS")
        self.block = _split_env(env, "HETERO_DISABLE_PLUGINS")
        self.records: dict[str, PluginRecord] = {}
        self.backends: dict[str, BackendEntry] = {}

    def load_entry_point(self, ep: md.EntryPoint) -> None:
        dist = getattr(ep, "dist", None)
        dist_name, version = (
            (dist.metadata["Name"], dist.version) if dist is not None else (ep.value.split(".")[0], "unknown")
        )
        if ep.name in self.records:
            return  # the same plugin seen twice (e.g. two paths on sys.path): load once
        if (self.allow and ep.name not in self.allow) or ep.name in self.block:
            why = (
                "not in HETERO_PLUGINS"
                if self.allow and ep.name not in self.allow
                else "listed in HETERO_DISABLE_PLUGINS"
            )
            self._fail(PluginRecord(ep.name, dist_name, version, "disabled", f"disabled: {why}"))
            return
        try:
            module = ep.load()
        except BaseException as e:  # SystemExit too: an import must never end the process
            if isinstance(e, KeyboardInterrupt):
                raise
            self._fail(
                PluginRecord(
                    ep.name,
                    dist_name,
                    version,
                    "broken",
                    f"import of '{ep.value}' failed: {type(e).__name__}: {e}",
                    traceback.format_exc(),
                )
            )
            return
        self.register(module, ep.name, dist=dist_name, version=version)

    def register(self, plugin: object, name: str, *, dist: str, version: str) -> PluginRecord:
        record = PluginRecord(name, dist, version)
        try:
            self.pm.register(plugin, name=name)
            classes = self._backend_classes(name)
        except Exception as e:
            if self.pm.is_registered(plugin):
                self.pm.unregister(plugin)
            record.status, record.error, record.traceback = "broken", f"{type(e).__name__}: {e}", traceback.format_exc()
            return self._fail(record)
        has_overrides = any(i.plugin_name == name for i in self.pm.hook.hetero_op_overrides.get_hookimpls())
        if not classes and not has_overrides:
            self.pm.unregister(plugin)
            record.status = "broken"
            record.error = "provides no backends and no op overrides (are its hooks decorated with @hetero.hookimpl?)"
            return self._fail(record)
        self.records[name] = record
        for cls in classes:
            self._add_backend(cls, record)
        return record

    def _backend_classes(self, plugin_name: str) -> list[type[Backend]]:
        classes: list[type[Backend]] = []
        for impl in self.pm.hook.hetero_backends.get_hookimpls():
            if impl.plugin_name != plugin_name:
                continue
            result = impl.function() or []
            for cls in result:
                if not (isinstance(cls, type) and issubclass(cls, Backend)):
                    raise TypeError(f"hetero_backends() returned {cls!r}, not a hetero.Backend subclass")
                if not isinstance(cls.name, str) or not cls.name:
                    raise TypeError(f"backend class {cls.__qualname__} has no name")
            classes.extend(result)
        return classes

    def _add_backend(self, cls: type[Backend], record: PluginRecord) -> None:
        if cls.name in self.backends and self.backends[cls.name].cls is not None:
            other = self.backends[cls.name].plugin
            record.problems.append(f"backend '{cls.name}' is already provided by plugin '{other}'; this one is ignored")
            return
        status, message = _version_problem(cls)
        entry = BackendEntry(cls.name, cls, record.name, record.version)
        if status == "incompatible":
            entry.status, entry.problem = status, message
        elif status == "warn":
            entry.warnings.append(message)
        self.backends[cls.name] = entry

    def _fail(self, record: PluginRecord) -> PluginRecord:
        self.records[record.name] = record
        if record.name not in self.backends:  # the entry point's name stands for its backend
            self.backends[record.name] = BackendEntry(
                record.name, None, record.name, record.version, record.error, record.status
            )
        return record

    def overrides(self, backend_name: str) -> dict[str, Binding]:
        table: dict[str, Binding] = {}
        for impl in reversed(self.pm.hook.hetero_op_overrides.get_hookimpls()):
            record = self.records.get(impl.plugin_name)
            try:
                result = impl.function(backend_name=backend_name) or {}
                items = list(result.items())
            except Exception as e:
                if record is not None:
                    record.problems.append(f"hetero_op_overrides({backend_name!r}) raised {type(e).__name__}: {e}")
                continue
            for op, fn in items:
                if op not in OPS or not callable(fn):
                    if record is not None:
                        record.problems.append(f"override {op!r} ignored: not a spec op with a callable")
                    continue
                table[op] = Binding(fn, f"override:{impl.plugin_name}", getattr(fn, "supports", None))
        return table
