"""How a spec module declares an operator: a documented, typed function with an empty body,
and the metadata a harness needs to call it and judge its results without knowing the op."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping

__all__ = ["OpSpec", "Output", "Comparison", "COMPARISONS", "spec_op"]

#: How an output is compared with the float64 oracle (see :class:`Output`).
Comparison = Literal["tolerance", "exact", "row_set"]
COMPARISONS: tuple[str, ...] = ("tolerance", "exact", "row_set")


@dataclass(frozen=True)
class Output:
    """One result of an op: a returned value or an argument it writes in place.

    - ``name``: the output's name (for a mutated argument, the parameter's name).
    - ``compare``: ``"tolerance"``, within the per-dtype tolerance of a float
      result; ``"exact"``, equal element for element (indices, counts, data
      movement); ``"row_set"``, equal as a set within each row (the order of the
      last dimension is free), the outputs named in ``reorders`` being permuted
      alike so each of their elements stays paired with its own.
    - ``when``: the parameter that asks for an optional output; the output exists
      iff that argument is neither None, False nor the integer 0 (``return_lse``,
      ``residual``, ``sinkhorn_iters``).
    - ``reorders``: for ``row_set`` only, the outputs paired element for element with this one.
    """

    name: str
    compare: Comparison = "tolerance"
    when: str | None = None
    reorders: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.compare not in COMPARISONS:
            raise ValueError(f"output '{self.name}': compare must be one of {COMPARISONS}")
        if self.reorders and self.compare != "row_set":
            raise ValueError(f"output '{self.name}': only a row_set output reorders others")

    def present(self, arguments: Mapping[str, Any]) -> bool:
        """Whether a call with these bound arguments (defaults applied) produces this output."""
        if self.when is None:
            return True
        value = arguments.get(self.when)
        return value is not None and value is not False and not (type(value) is int and value == 0)


@dataclass(frozen=True)
class OpSpec:
    """One operator of the interface: its name, family, signature, documented semantics and metadata.

    The metadata fields are declared by each op next to its signature (``spec_op``):

    - ``returns``: what the call returns, in order: nothing (``()``, the op
      returns None), one output (a tensor or a spec type), or several (a tuple of
      those present, in this order).
    - ``mutates``: the arguments it writes in place; one given as None is not
      written. A mutated argument that shares a returned output's name is that
      output (``out=``: the op writes into it and returns it). An op may both
      return outputs and mutate arguments.
    - ``collective``: every rank of its communicator must call it together.
    """

    name: str
    family: str
    signature: inspect.Signature
    doc: str
    returns: tuple[Output, ...] = ()
    mutates: tuple[Output, ...] = ()
    collective: bool = False

    @property
    def outputs(self) -> tuple[Output, ...]:
        """Every output by name: the returned ones, then the mutated arguments not among them."""
        returned = {o.name for o in self.returns}
        return self.returns + tuple(m for m in self.mutates if m.name not in returned)

    @property
    def mutated_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.mutates)

    def output(self, name: str) -> Output:
        """The output called ``name`` (KeyError if the op has none)."""
        for o in self.outputs:
            if o.name == name:
                return o
        raise KeyError(f"{self.name} has no output '{name}'")

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


def _outputs(items: tuple[Output | str, ...]) -> tuple[Output, ...]:
    return tuple(o if isinstance(o, Output) else Output(o) for o in items)


def _check(spec: OpSpec) -> None:
    """Metadata that contradicts the signature is a bug of the spec module: fail at import."""
    params = spec.signature.parameters
    names = [o.name for o in spec.outputs]
    if len(set(names)) != len(names):
        raise ValueError(f"{spec.name}: output names repeat: {names}")
    for o in spec.mutates:
        if o.name not in params:
            raise ValueError(f"{spec.name}: mutates '{o.name}', which is not a parameter")
    for o in spec.outputs:
        if o.when is not None and o.when not in params:
            raise ValueError(f"{spec.name}: output '{o.name}' depends on unknown parameter '{o.when}'")
        if not set(o.reorders) <= set(names):
            raise ValueError(f"{spec.name}: output '{o.name}' reorders unknown outputs {o.reorders}")


def spec_op(
    *, returns: tuple[Output | str, ...], mutates: tuple[Output | str, ...] = (), collective: bool = False
) -> Callable[[Callable], Callable]:
    """Mark a function of a spec module as an operator declaration, with its metadata.

    ``returns`` and ``mutates`` take :class:`Output` objects or bare names (an
    output compared within tolerance, always present); see :class:`OpSpec`.
    """

    def mark(fn: Callable) -> Callable:
        spec = OpSpec(
            name=fn.__name__,
            family=fn.__module__.rsplit(".", 1)[-1],
            signature=inspect.signature(fn),
            doc=inspect.getdoc(fn) or "",
            returns=_outputs(returns),
            mutates=_outputs(mutates),
            collective=collective,
        )
        _check(spec)
        fn.__hetero_op__ = spec
        return fn

    return mark
