"""Importing Triton the one way hetero does: lazily, with the interpreter switched on first when asked."""

from __future__ import annotations

import os
from types import ModuleType

__all__ = ["interpreter_requested", "triton_modules", "triton_missing_reason"]

ENV = "HETERO_TRITON_INTERPRET"


def interpreter_requested() -> bool:
    """``HETERO_TRITON_INTERPRET=1``: run the Triton kernels through Triton's interpreter on CPU tensors."""
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


def triton_modules() -> tuple[ModuleType, ModuleType]:
    """(triton, triton.language), importing them now. Under ``HETERO_TRITON_INTERPRET=1`` Triton's own
    ``TRITON_INTERPRET=1`` is set before the first import, which is when Triton reads it."""
    if interpreter_requested():
        os.environ["TRITON_INTERPRET"] = "1"
    import triton
    import triton.language as tl

    return triton, tl


def triton_missing_reason() -> str | None:
    """None if Triton imports, else why not (for probes)."""
    try:
        triton_modules()
    except Exception as e:  # ImportError, or a broken install raising anything at import
        return f"triton is not importable: {type(e).__name__}: {e}"
    return None
