"""The hetero op table this process routes to: loaded once, lazily, on the first routed call.

The backend's name comes from the engine's ``additional_config={"hetero_backend": name}``
when given, else from ``HETERO_BACKEND``, else ``hetero.load()`` picks the best available
one. The engine argument wins because it is the more specific of the two: one engine's
choice, where the environment variable is the whole process's (and its workers').
The configuration is read when vLLM builds the routed layers (``remember_config``,
under vLLM's current config), because the first routed call may run outside it.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from hetero_vllm import report

__all__ = ["BACKEND_ENV", "CONFIG_KEY", "backend_name", "remember_config", "ops"]

#: The environment variable naming the hetero backend (hetero's own; unset: hetero picks the best available).
BACKEND_ENV = "HETERO_BACKEND"
#: The key of vLLM's ``additional_config`` naming the hetero backend; it wins over ``HETERO_BACKEND``.
CONFIG_KEY = "hetero_backend"

_lock = threading.Lock()
_tables: dict[str | None, Any] = {}
_configured: list[str] = []


def _from_config(vllm_config: Any) -> str | None:
    extra = getattr(vllm_config, "additional_config", None)
    value = extra.get(CONFIG_KEY) if isinstance(extra, dict) else None
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ValueError(
            f"hetero-vllm: additional_config[{CONFIG_KEY!r}] must be a backend name (a non-empty "
            f"string such as 'cpu_ref'), got {value!r}"
        )
    return value.strip() if value else None


def remember_config(vllm_config: Any = None) -> None:
    """Note ``additional_config["hetero_backend"]`` of ``vllm_config`` (None: vLLM's current config, if set)."""
    if vllm_config is None:
        from vllm.config import get_current_vllm_config_or_none

        vllm_config = get_current_vllm_config_or_none()
    name = _from_config(vllm_config)
    if name is not None:
        _configured[:] = [name]


def backend_name() -> str | None:
    """The backend asked for (the engine's additional_config, else ``HETERO_BACKEND``), or None: hetero chooses."""
    if _configured:
        return _configured[0]
    return os.environ.get(BACKEND_ENV) or None


def ops() -> Any:
    """``hetero.load(backend_name())``, built on the first call for that name in this process and kept."""
    name = backend_name()
    if name not in _tables:
        with _lock:
            if name not in _tables:
                import hetero

                remember_config()
                name = backend_name()
                table = hetero.load(name)
                report.set_backend(table.name)
                _tables[name] = table
    return _tables[name]
