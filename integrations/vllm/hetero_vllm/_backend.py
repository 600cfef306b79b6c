"""The hetero op table this process routes to: loaded once, lazily, on the first routed call."""
from __future__ import annotations

import os
import threading
from typing import Any

from hetero_vllm import report

__all__ = ["BACKEND_ENV", "backend_name", "ops"]

#: The environment variable naming the hetero backend (hetero's own; unset: hetero picks the best available).
BACKEND_ENV = "HETERO_BACKEND"

_lock = threading.Lock()
_table: list[Any] = []


def backend_name() -> str | None:
    """The backend asked for, or None to let ``hetero.load`` choose."""
    return os.environ.get(BACKEND_ENV) or None


def ops() -> Any:
    """``hetero.load(backend_name())``, built on the first call of this process and kept."""
    if not _table:
        with _lock:
            if not _table:
                import hetero

                table = hetero.load(backend_name())
                report.set_backend(table.name)
                _table.append(table)
    return _table[0]
