"""The op-call seam: wrap every op a model's layers call, with its module path, and restore it.

Layers declare their op slots with ``ModelContext.bind_op`` (attribute -> op name)
and call the plain resolved callable; ``instrument`` swaps each slot for a wrapper
that hands the call to a hook, and ``restore`` puts the original objects back. A
model never instrumented, or instrumented and restored, runs exactly the callables
it resolved at init: the seam costs nothing per call when unused.

A hook is ``hook(site, fn, args, kwargs) -> result``: it may call through
(``fn(*args, **kwargs)``), time, record or replace the call. A timer::

    def timer(site, fn, args, kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds[site.path, site.op] += time.perf_counter() - start

Only op calls are seen: torch glue inside layers (embedding lookup, ``cat``,
``index_select``, a bias add after an all-reduce) and collectives are not ops.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from torch import nn

from hetero.engine.context import op_slots
from hetero.errors import UsageError

__all__ = ["OpSite", "OpHook", "Instrumented", "instrument", "op_sites", "OpCounter"]

#: a module's attribute holding its original callables while it is instrumented
_ORIGINALS = "_instrumented_ops"


@dataclass(frozen=True)
class OpSite:
    """Where an op call comes from: the module path ("model.layers.3.self_attn.attn"), the
    layer's attribute ("_attention") and the op ("paged_attention")."""

    path: str
    attr: str
    op: str


class OpHook(Protocol):
    """``hook(site, fn, args, kwargs)`` runs in place of ``fn(*args, **kwargs)`` and returns its result."""

    def __call__(self, site: OpSite, fn: Callable, args: tuple, kwargs: dict[str, Any]) -> Any: ...


def op_sites(model: nn.Module) -> list[tuple[nn.Module, OpSite]]:
    """Every declared op slot of ``model`` and its submodules, in ``named_modules`` order."""
    return [
        (module, OpSite(path, attr, op))
        for path, module in model.named_modules()
        for attr, op in op_slots(module).items()
    ]


def _wrap(site: OpSite, fn: Callable, hook: OpHook) -> Callable:
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return hook(site, fn, args, kwargs)
        except Exception as e:
            note = f"in op {site.op!r} called by {site.path or '<root>'} ({site.attr})"
            if note not in getattr(e, "__notes__", ()):
                e.add_note(note)
            raise

    call.__qualname__ = f"instrumented[{site.path}.{site.attr}]"
    call.__wrapped__ = fn  # type: ignore[attr-defined]
    return call


class Instrumented:
    """The handle ``instrument`` returns: ``restore()`` (idempotent), or use it as a context manager."""

    def __init__(self, model: nn.Module, hook: OpHook):
        sites = op_sites(model)
        busy = sorted({s.path or "<root>" for m, s in sites if _ORIGINALS in vars(m)})
        if busy:
            more = f" and {len(busy) - 3} more" if len(busy) > 3 else ""
            raise UsageError(
                f"instrument: {', '.join(busy[:3])}{more} already instrumented; restore it first (hooks do not nest)"
            )
        self.sites = [s for _, s in sites]
        self._modules: list[nn.Module] = []
        for module, site in sites:
            originals = vars(module).setdefault(_ORIGINALS, {})
            if not originals:
                self._modules.append(module)
            fn = getattr(module, site.attr)
            originals[site.attr] = fn
            setattr(module, site.attr, _wrap(site, fn, hook))

    def restore(self) -> None:
        """Put back the exact callables the layers held before ``instrument``."""
        for module in self._modules:
            for attr, fn in vars(module).pop(_ORIGINALS, {}).items():
                setattr(module, attr, fn)
        self._modules = []

    def __enter__(self) -> Instrumented:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.restore()


def instrument(model: nn.Module, hook: OpHook) -> Instrumented:
    """Route every op call of ``model`` through ``hook`` until ``restore()`` (or the ``with`` block ends).

    Raises UsageError when some of its modules are instrumented already.
    """
    return Instrumented(model, hook)


class OpCounter:
    """A hook that counts calls per (module path, op) and calls through."""

    def __init__(self) -> None:
        self.calls: Counter[tuple[str, str]] = Counter()

    def __call__(self, site: OpSite, fn: Callable, args: tuple, kwargs: dict[str, Any]) -> Any:
        self.calls[site.path, site.op] += 1
        return fn(*args, **kwargs)

    def per_op(self) -> Counter[str]:
        """Calls per op name."""
        out: Counter[str] = Counter()
        for (_, op), n in self.calls.items():
            out[op] += n
        return out
