"""The reference engine: Hugging Face checkpoints through hetero ops (see docs/engine.md and docs/architecture.md).

``from hetero.engine import LLM, SamplingParams`` (and ``RequestOutput``, ``Logprob``,
``EngineConfig``); those names load on first use, so
``import hetero.engine`` stays light (no transformers, no model code). The op-call
seam (``instrument``, ``OpSite``, ``OpCounter``, ``op_sites``) is imported eagerly: it
needs only torch and two small modules, and its function ``instrument`` shares its
submodule's name, so a lazy attribute would be shadowed by the submodule as soon as
anything imported ``hetero.engine.instrument``.
"""

from __future__ import annotations

import importlib
from typing import Any

from hetero.engine.instrument import OpCounter, OpSite, instrument, op_sites

__all__ = [
    "LLM",
    "SamplingParams",
    "RequestOutput",
    "Logprob",
    "EngineConfig",
    "instrument",
    "OpSite",
    "OpCounter",
    "op_sites",
]

_EXPORTS = {
    "LLM": "hetero.engine.llm",
    "RequestOutput": "hetero.engine.llm",
    "SamplingParams": "hetero.engine.runtime.sequence",
    "Logprob": "hetero.engine.runtime.sequence",
    "EngineConfig": "hetero.engine.config",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hetero.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
