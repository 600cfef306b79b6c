"""What the torch_npu ops of hetero_ascend share: the one torch_npu lookup, and how an op that may hand a call
to the portable Triton kernel is bound (:class:`WithTriton`)."""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any, Callable

from hetero.backend import PerBackendOp
from hetero.kernels import TritonBackend

__all__ = ["torch_npu", "TritonOps", "WithTriton"]


def torch_npu() -> Any:
    """The torch_npu module, imported at the call, never at import (it needs a matching CANN). Every op and the
    probe call it as ``common.torch_npu()``, so one replacement (a test's fake torch_npu) reaches them all."""
    return importlib.import_module("torch_npu")


class TritonOps:
    """A backend's portable Triton ops: ``triton.rms_norm(...)`` runs ``TritonBackend.rms_norm`` with that
    backend's tuning, looked up at the call, as ``super().rms_norm(...)`` in a method of the backend would."""

    def __init__(self, backend: Any):
        self._backend = backend

    def __getattr__(self, op: str) -> Callable:
        return getattr(TritonBackend, op).__get__(self._backend, TritonBackend)


class WithTriton(PerBackendOp):
    """An op that chooses per call between torch_npu and the portable Triton kernel, written as a function
    ``fn(triton, *args, **kwargs)`` whose first argument is a :class:`TritonOps`: on a backend it is
    ``partial(fn, TritonOps(backend))``, under fn's name and signature without ``triton``. A module lists it in
    ``__all__`` like a plain function; ``Backend.bind_from`` binds it as a descriptor.
    """

    def __init__(self, fn: Callable):
        signature = inspect.signature(fn)
        super().__init__(
            lambda backend: functools.partial(fn, TritonOps(backend)),
            name=fn.__name__,
            qualname=fn.__qualname__,
            module=fn.__module__,
            doc=fn.__doc__,
            signature=signature.replace(parameters=list(signature.parameters.values())[1:]),
        )
        self.__wrapped__ = fn
