"""``hetero serve``: an OpenAI-compatible HTTP server over hetero's engine (FastAPI and uvicorn, the
``hetero[serve]`` extra; imported on first use, so the ``hetero`` command runs without them)."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["build_app", "EngineLoop"]

_HOME = {"build_app": "hetero.serve.app", "EngineLoop": "hetero.serve.engine_loop"}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'hetero.serve' has no attribute {name!r}")
