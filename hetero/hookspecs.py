"""The pluggy hook specifications of hetero. A plugin module implements them with ``@hetero.hookimpl``."""

from __future__ import annotations

from typing import Callable

import pluggy

from hetero.backend import Backend

__all__ = ["hookspec", "hookimpl", "PROJECT", "hetero_backends", "hetero_op_overrides"]

PROJECT = "hetero"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def hetero_backends() -> list[type[Backend]]:
    """Return the Backend subclasses this plugin provides (usually one)."""


@hookspec
def hetero_op_overrides(backend_name: str) -> dict[str, Callable] | None:
    """Return op implementations that add to or replace those of backend ``backend_name``
    (a faster attention package for ``cuda``, say), keyed by op name, or None.

    Each callable takes the op's spec signature. It may carry an attribute
    ``supports(**static) -> str | None`` with the same meaning as ``Backend.supports``.
    """
