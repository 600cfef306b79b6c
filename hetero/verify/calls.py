"""Calling one implementation of an op with a case's arguments."""

from __future__ import annotations

from typing import Any, Callable

from hetero.spec import OPS

__all__ = ["call"]


def call(fn: Callable, op: str, inputs: dict[str, Any]) -> Any:
    """Invoke an implementation with the case's arguments bound to the spec signature."""
    bound = OPS[op].signature.bind(**inputs)
    return fn(*bound.args, **bound.kwargs)
