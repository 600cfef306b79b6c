"""Ops: the resolved op table an engine calls. One attribute per op, no dispatch per call."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from hetero.backend import Backend
from hetero.errors import OpError, OpNotAvailable
from hetero.spec import OP_NAMES, OPS
from hetero.spec.checks import check_meta, check_meta_shapes, check_state_batch
from hetero.spec.types import AttentionMeta, Plan
from hetero.spec.validate import VALIDATORS

__all__ = ["Ops", "OpInfo", "Binding", "PLANNED_OPS", "takes_option"]

BACKEND, FALLBACK, MISSING = "backend", "fallback", "missing"
#: The ops each kind of step plan serves.
PLANNED_OPS = {
    "attention": ("paged_attention", "mla_attention", "indexer_topk"),
    "recurrent": ("causal_conv1d", "gated_delta_rule"),
}


@dataclass
class OpInfo:
    """How one op is served: the callable's qualified name, its origin and every reason recorded."""

    op: str
    implementation: str
    origin: str  # "backend", "override:<plugin>", "fallback" or "missing"
    reasons: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "implementation": self.implementation,
            "origin": self.origin,
            "reasons": list(self.reasons),
        }


@dataclass(frozen=True)
class Binding:
    """A candidate implementation of an op: the callable, where it came from, and its own supports()."""

    fn: Callable
    origin: str
    supports: Callable[..., str | None] | None = None


def _qualname(fn: Callable) -> str:
    fn = getattr(fn, "__func__", fn)
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _validated(fn: Callable, check: Callable) -> Callable:
    """fn behind its index-content validator: a malformed call raises OpError before fn runs."""

    def call(*args: Any, **kwargs: Any) -> Any:
        check(*args, **kwargs)
        return fn(*args, **kwargs)

    call.__qualname__ = f"validated[{_qualname(fn)}]"
    call.__wrapped__ = fn  # type: ignore[attr-defined]
    return call


def _refusal(backend: str, op: str, reason: str) -> Callable:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise OpNotAvailable(backend, op, reason)

    refuse.__qualname__ = f"refuse[{op}]"
    return refuse


class Ops:
    """The op table of one backend on one device: ``ops.gemm(a, b)`` is a plain Python call.

    Each op attribute is the native implementation (or an override from another
    plugin); an op the backend lacks is the reference's, reported as fallback, or,
    with ``strict=True``, a callable that raises OpNotAvailable. With the backend's
    ``validate`` on, an op that takes index tensors is that implementation behind
    its ``hetero.spec.validate`` check, unless the backend validates them itself.
    """

    def __init__(
        self,
        backend: Backend,
        reference: Backend | None,
        overrides: dict[str, Binding],
        *,
        strict: bool = False,
    ):
        self.backend = backend
        self.reference = reference
        self.strict = strict
        self._native: dict[str, Binding] = {}
        self._info: dict[str, OpInfo] = {}
        self._hooks = set(type(backend).plans())
        native = set(type(backend).native_ops())
        notes = type(backend).op_notes()
        for op in OP_NAMES:
            if op in overrides:
                binding = overrides[op]
            elif op in native:
                binding = Binding(getattr(backend, op), BACKEND, lambda op=op, **s: backend.supports(op, **s))
            else:
                binding = None
            if binding is None:
                self._bind_fallback(op, f"not implemented by backend '{backend.name}'")
                continue
            self._info[op] = OpInfo(
                op,
                _qualname(binding.fn),
                binding.origin,
                [notes[op]] if op in notes and binding.origin == BACKEND else [],
            )
            if backend.validate and not backend.validates_indices and op in VALIDATORS:
                binding = Binding(_validated(binding.fn, VALIDATORS[op]), binding.origin, binding.supports)
            self._native[op] = binding
            setattr(self, op, binding.fn)

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def device(self):
        return self.backend.device

    @property
    def validate(self) -> bool:
        """Whether the backend checks index contents (``hetero.load(validate=...)``)."""
        return self.backend.validate

    def _note(self, op: str, reason: str) -> None:
        reasons = self._info[op].reasons
        if reason not in reasons:
            reasons.append(reason)

    def _bind_fallback(self, op: str, reason: str) -> None:
        self._info[op] = OpInfo(op, "", FALLBACK if self.reference is not None else MISSING, [reason])
        if self.reference is None:
            fn = _refusal(self.backend.name, op, f"{reason}, and the reference backend is not installed")
        elif self.strict:
            fn = _refusal(self.backend.name, op, f"{reason} (strict=True refuses the reference fallback)")
        else:
            fn = getattr(self.reference, op)
        setattr(self, op, fn)
        self._info[op].implementation = _qualname(fn)

    def plan_attention(
        self, meta: AttentionMeta, *, num_tokens: int, num_blocks: int, block_size: int
    ) -> AttentionMeta:
        """``meta`` with the step's :class:`~hetero.spec.types.Plan` attached, for T tokens over
        caches of NB blocks of BS slots: its values checked here once when validation is on (so the
        ops of every layer skip that check), and the backend's ``plan_attention`` hook's preparation
        when it has one. Call once per step and pass the result to every layer."""
        op = "plan_attention"
        if self.backend.validate:
            check_meta(op, meta, num_tokens, num_blocks, block_size)
        else:
            check_meta_shapes(op, meta, num_tokens)
        sizes = (num_tokens, num_blocks, block_size, meta.max_query_len, meta.max_seq_len)
        data = self._hook("attention", meta, num_tokens=num_tokens, num_blocks=num_blocks, block_size=block_size)
        return dataclasses.replace(meta, plan=Plan(meta.tensors(), sizes, self.backend.validate, self.name, data))

    def plan_recurrent(
        self,
        query_start_loc: torch.Tensor,
        state_slots: torch.Tensor,
        has_initial_state: torch.Tensor,
        *,
        num_tokens: int,
        num_slots: int,
    ) -> Plan:
        """The step's plan of the recurrent ops' index tensors over T tokens and S state slots, for
        their ``plan=`` option: checked once here when validation is on, and the backend's
        ``plan_recurrent`` hook's preparation when it has one. State slots [N] only: a call with
        per-token slots [N, M] (spec 1.11) takes no plan."""
        index = (query_start_loc, state_slots, has_initial_state)
        if isinstance(state_slots, torch.Tensor) and state_slots.ndim != 1:
            raise OpError(
                "plan_recurrent", "state_slots", "shape [N] (per-token slots [N, M] take no step plan)",
                f"shape {list(state_slots.shape)}",
            )  # fmt: skip
        if self.backend.validate:
            check_state_batch("plan_recurrent", *index, num_tokens, num_slots)
        data = self._hook("recurrent", *index, num_tokens=num_tokens, num_slots=num_slots)
        return Plan(index, (num_tokens, num_slots), self.backend.validate, self.name, data)

    def _hook(self, kind: str, *args: Any, **sizes: int) -> Any:
        """The backend's plan_<kind> hook's result; a hook that fails other than with an OpError is
        turned off for this table, the reason recorded on the ops it serves (``explain``)."""
        if kind not in self._hooks:
            return None
        try:
            return getattr(self.backend, f"plan_{kind}")(*args, **sizes)
        except OpError:
            raise
        except Exception as e:  # a broken hook must not take the ops down: they work without a plan
            self._hooks.discard(kind)
            for op in PLANNED_OPS[kind]:
                self._note(op, f"plan_{kind} hook raised {type(e).__name__}: {e}; the ops run unplanned")
            return None

    def native(self, op: str, **static: Any) -> tuple[Binding | None, str | None]:
        """The native (backend or override) binding of ``op`` and, when its ``supports``
        declines this static configuration, the reason; (None, why) when the op is
        not native at all. Records nothing: conformance asks this per case."""
        if op not in OPS:
            raise OpNotAvailable(self.backend.name, op, f"'{op}' is not an op of the spec; ops: {', '.join(OP_NAMES)}")
        binding = self._native.get(op)
        if binding is None:
            return None, self._info[op].reasons[0]
        reason = _missing_option(binding.fn, op, static)
        if reason is None and binding.supports is not None:
            reason = binding.supports(**static)
        return binding, reason

    def resolve(self, op: str, **static: Any) -> Callable:
        """The implementation to use for ``op`` in a static configuration (dtype=..., head_dim=...).

        Asks the implementation's ``supports`` once; when it declines, returns the
        reference (recording the reason, shown by ``explain``), or raises
        OpNotAvailable under ``strict=True``. Call it at layer init, not per step.
        """
        binding, reason = self.native(op, **static)
        if binding is None:
            return getattr(self, op)
        if reason is None:
            return binding.fn
        detail = ", ".join(f"{k}={v}" for k, v in sorted(static.items()))
        reason = f"{binding.origin} declined ({detail}): {reason}"
        self._note(op, reason)
        if self.strict or self.reference is None:
            raise OpNotAvailable(self.backend.name, op, reason)
        return getattr(self.reference, op)

    def explain(self) -> dict[str, OpInfo]:
        """Per op: the implementation, its origin and the reasons recorded so far."""
        return {op: OpInfo(i.op, i.implementation, i.origin, list(i.reasons)) for op, i in self._info.items()}

    def __repr__(self) -> str:
        fallback = sum(1 for i in self._info.values() if i.origin != BACKEND and not i.origin.startswith("override"))
        return (
            f"<Ops {self.backend.name!r} on {self.backend.device}: "
            f"{len(OP_NAMES) - fallback} native, {fallback} fallback>"
        )


def takes_option(fn: Callable, op: str, option: str) -> bool:
    """Whether ``fn``, an implementation of ``op``, takes the spec's keyword option ``option`` (one
    written against an older minor version of the spec may not): a caller passes it only then."""
    return _missing_option(fn, op, {option: None}) is None


def _missing_option(fn: Callable, op: str, static: dict[str, Any]) -> str | None:
    """Why ``fn`` cannot serve a call that sets a keyword option of the spec it does not take (an
    implementation written against an older minor version of the spec), else None."""
    params = OPS[op].signature.parameters
    options = [k for k in static if k in params and params[k].kind is inspect.Parameter.KEYWORD_ONLY]
    if not options:
        return None
    try:
        accepted = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
        return None
    missing = [k for k in options if k not in accepted]
    return f"takes no {', '.join(repr(k) for k in missing)} (an option newer than it)" if missing else None
