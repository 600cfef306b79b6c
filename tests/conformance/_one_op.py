"""A plugin that is the reference backend with one op replaced: every planted-bug and control backend."""

from __future__ import annotations

from typing import Any

import hetero
from hetero_cpu_ref.plugin import CpuRefBackend


def one_op_plugin(name: str, op: str, impl: Any) -> tuple[Any, str, str]:
    """(plugin object, backend name, op): backend ``name`` is cpu_ref with ``op`` implemented by ``impl``."""
    cls = type(name.title().replace("_", ""), (CpuRefBackend,), {"name": name, "priority": 0, op: impl})

    class Plugin:
        @hetero.hookimpl
        def hetero_backends(self):
            return [cls]

    return Plugin(), cls.name, op
