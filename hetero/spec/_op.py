"""How a spec module declares an operator: a documented, typed function with an empty body."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

__all__ = ["OpSpec", "spec_op"]


@dataclass(frozen=True)
class OpSpec:
    """One operator of the interface: its name, family, signature and documented semantics."""

    name: str
    family: str
    signature: inspect.Signature
    doc: str
    inplace: bool

    def check_signature(self, fn: Callable) -> str | None:
        """None if `fn` (a function or bound method) takes the spec's parameters, else the reason."""
        try:
            got = inspect.signature(fn)
        except (TypeError, ValueError) as e:
            return f"cannot read its signature: {e}"
        want = [(p.name, p.kind, p.default) for p in self.signature.parameters.values()]
        have = [(p.name, p.kind, p.default) for p in got.parameters.values()]
        if want != have:
            return f"signature {got} differs from the spec's {self.signature}"
        return None


def spec_op(*, inplace: bool = False) -> Callable[[Callable], Callable]:
    """Mark a function of a spec module as an operator declaration."""

    def mark(fn: Callable) -> Callable:
        family = fn.__module__.rsplit(".", 1)[-1]
        fn.__hetero_op__ = OpSpec(
            name=fn.__name__,
            family=family,
            signature=inspect.signature(fn),
            doc=inspect.getdoc(fn) or "",
            inplace=inplace,
        )
        return fn

    return mark
