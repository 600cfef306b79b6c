"""Commands other packages add to ``hetero``: the entry point group ``hetero.commands``.

An installed package declares, in its pyproject.toml::

    [project.entry-points."hetero.commands"]
    conformance = "hetero_conformance.commands"

The entry point names an object (usually a module) that may define either or both of:

* ``add_parsers(subparsers)``: add its subcommands to the ``hetero`` command's subparsers
  (each parser's ``func(args, registry, console) -> int`` runs it, as for the built-in ones);
* ``backend_files(values) -> dict[str, str]``: more files for the package ``hetero new-backend``
  writes (path relative to ``hetero-NAME/`` -> text); ``values`` holds ``name``, ``pkg``, ``dist``,
  ``cls`` and ``spec_version``.

This is how ``hetero conformance`` and the conformance test of a generated backend come from
hetero-conformance without ``hetero`` importing it. Each entry point is loaded inside a guard:
one that fails to load is reported (:attr:`Command.error`), never fatal to the others.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

__all__ = ["GROUP", "Command", "commands", "backend_files"]

GROUP = "hetero.commands"


@dataclass(frozen=True)
class Command:
    """One entry point of the group: its name, the distribution declaring it, the loaded object or the error."""

    name: str
    dist: str
    obj: Any = None
    error: str = ""


def commands() -> list[Command]:
    """Every entry point of ``hetero.commands``, sorted by name, each loaded (or its load error kept)."""
    found = []
    for ep in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        dist = ep.dist.name if getattr(ep, "dist", None) is not None else ""
        try:
            found.append(Command(ep.name, dist, ep.load()))
        except Exception as e:  # a broken plugin is reported, it does not take the command down
            found.append(Command(ep.name, dist, error=traceback.format_exception_only(type(e), e)[-1].strip()))
    return found


def backend_files(values: dict[str, str], found: list[Command] | None = None) -> dict[str, str]:
    """The files the loaded commands add to a package ``hetero new-backend`` writes (see the module docstring)."""
    files: dict[str, str] = {}
    for command in commands() if found is None else found:
        contribute = getattr(command.obj, "backend_files", None)
        if contribute is not None:
            files.update(contribute(dict(values)))
    return files
