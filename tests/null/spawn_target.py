"""Runs inside processes started with the spawn method (importable by module name there)."""

from __future__ import annotations

import os


def load_in_child(queue, backend_env: str) -> None:
    os.environ["HETERO_BACKEND"] = backend_env
    import hetero

    ops = hetero.load()
    origins = {i.origin for i in ops.explain().values()}
    queue.put((ops.name, sorted(origins), os.getpid()))
