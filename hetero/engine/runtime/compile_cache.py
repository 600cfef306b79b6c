"""Where the engine's compiled graphs persist across processes, and the key that names them.

Inductor's own caches (its FX graph cache, AOTAutograd's cache and the compiled kernels) are
content-addressed but live in one directory per user. The engine gives each (model, engine
configuration, code) its own directory under ``HETERO_CACHE_ROOT`` (default
``$XDG_CACHE_HOME/hetero``, else ``~/.cache/hetero``): ``compile/<key>/rank<r>``, where the key
hashes what vLLM's cache key hashes, namely the model's ``config.json``, the dtype, the settings
that shape the graph (backend, device, block size, batch limits, parallel sizes, quantization,
compile mode), the torch and hetero versions and the source of the code the graph is traced
from. A restart of the same server finds its graphs there. ``HETERO_COMPILE_CACHE=0`` compiles
in a fresh temporary directory each time instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch

__all__ = ["ENV_ROOT", "ENV_ENABLE", "cache_root", "cache_key", "cache_dir", "source_hash"]

ENV_ROOT, ENV_ENABLE = "HETERO_CACHE_ROOT", "HETERO_COMPILE_CACHE"


def cache_root(env: Mapping[str, str] | None = None) -> Path:
    """``HETERO_CACHE_ROOT``, else ``$XDG_CACHE_HOME/hetero``, else ``~/.cache/hetero``."""
    env = os.environ if env is None else env
    if env.get(ENV_ROOT):
        return Path(env[ENV_ROOT])
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hetero"


def source_hash(packages: Iterable[str]) -> str:
    """sha256 of every ``.py`` file of these importable packages (path and contents, sorted):
    a graph traced from changed code is not reused."""
    import importlib.util

    h = hashlib.sha256()
    for name in sorted(set(packages)):
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            h.update(f"{name}:missing".encode())
            continue
        for location in spec.submodule_search_locations:
            root = Path(location)
            for path in sorted(root.rglob("*.py")):
                h.update(str(path.relative_to(root)).encode())
                h.update(path.read_bytes())
    return h.hexdigest()


def cache_key(factors: Mapping[str, Any]) -> str:
    """The first 16 hex digits of the sha256 of ``factors`` as sorted JSON (plus torch's and the
    traced code's identity)."""
    import hetero

    full = {
        **factors,
        "torch": torch.__version__,
        "hetero": getattr(hetero, "__version__", "?"),
        "source": source_hash(["hetero", *factors.get("packages", ())]),
    }
    return hashlib.sha256(json.dumps(full, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cache_dir(factors: Mapping[str, Any], rank: int, env: Mapping[str, str] | None = None) -> Path:
    """``<root>/compile/<key>/rank<r>``, created; a fresh temporary directory when
    ``HETERO_COMPILE_CACHE`` is 0/false/off."""
    env = os.environ if env is None else env
    if env.get(ENV_ENABLE, "").strip().lower() in ("0", "false", "off", "no"):
        return Path(tempfile.mkdtemp(prefix="hetero-compile-"))
    path = cache_root(env) / "compile" / cache_key(factors) / f"rank{rank}"
    path.mkdir(parents=True, exist_ok=True)
    return path
