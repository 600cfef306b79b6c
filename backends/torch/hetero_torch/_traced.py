"""What this backend tells torch.compile without importing torch._dynamo (about 1.3 s of every process that loads
the backend and never compiles)."""

from __future__ import annotations

__all__ = ["constant_when_traced"]


def constant_when_traced(fn):
    """``torch.compiler.assume_constant_result``'s mark: traced, ``fn``'s answer is a constant of the graph.
    ``tests/backend/test_torch_backend.py`` checks that torch marks a function so."""
    fn._dynamo_marked_constant = True
    return fn
