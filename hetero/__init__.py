"""hetero: a hardware-neutral operator layer for LLM inference.

``ops = hetero.load("cuda")`` selects a backend plugin (by name, ``HETERO_BACKEND``,
or the available one of highest priority) and returns its op table.
"""

from __future__ import annotations

from hetero.backend import Availability, Backend
from hetero.errors import (
    BackendIncompatible,
    BackendNotFound,
    BackendUnavailable,
    CommError,
    HeteroError,
    OpError,
    OpNotAvailable,
)
from hetero.hookspecs import hookimpl
from hetero.ops import OpInfo, Ops
from hetero.registry import Registry, default_registry, load
from hetero.spec import SPEC_VERSION, AttentionMeta

__version__ = "0.1.0"

__all__ = [
    "load",
    "Backend",
    "Availability",
    "Ops",
    "OpInfo",
    "Registry",
    "default_registry",
    "hookimpl",
    "AttentionMeta",
    "SPEC_VERSION",
    "HeteroError",
    "OpError",
    "OpNotAvailable",
    "BackendNotFound",
    "BackendUnavailable",
    "BackendIncompatible",
    "CommError",
]
