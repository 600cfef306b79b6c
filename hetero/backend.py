"""The Backend base class a plugin subclasses, the Availability its probe returns, and PerBackendOp."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from functools import partial
from types import FunctionType, MethodType, ModuleType
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping

import torch

from hetero.spec import OP_NAMES, OPS

if TYPE_CHECKING:
    from hetero.spec.comm import Communicator

__all__ = ["Backend", "Availability", "PerBackendOp", "spec_ops"]

OpSource = ModuleType | Mapping[str, Callable]


def spec_ops(*sources: OpSource) -> dict[str, Callable]:
    """The op implementations ``sources`` provide, by op name; a later source wins.

    A module provides each name in its ``__all__`` that is a spec op (its helpers are ignored);
    a mapping provides its items, and a key that is not a spec op is a ValueError.
    """
    found: dict[str, Callable] = {}
    for source in sources:
        if isinstance(source, ModuleType):
            found.update((n, getattr(source, n)) for n in getattr(source, "__all__", ()) if n in OPS)
            continue
        unknown = [n for n in source if n not in OPS]
        if unknown:
            raise ValueError(f"not spec ops: {', '.join(map(repr, unknown))}")
        found.update(source)
    return found


def _class_attribute(fn: Callable) -> Any:
    """``fn`` as a class attribute that is called without ``self``: a descriptor other than a function
    (or a partial, which is one from Python 3.14) binds as it defines."""
    return staticmethod(fn) if isinstance(fn, (FunctionType, partial)) or not hasattr(type(fn), "__get__") else fn


class _ClassOrInstanceMethod:
    """A method bound to the instance it is called on, or to the class when called on the class."""

    def __init__(self, fn: Callable):
        self.__func__, self.__doc__, self.__name__ = fn, fn.__doc__, fn.__name__

    def __get__(self, obj: Any, owner: type | None = None) -> Callable:
        return MethodType(self.__func__, owner if obj is None else obj)


class PerBackendOp:
    """An op built for the backend it is called on, e.g. ``partial(kernel, tuning=backend.tune)``; a descriptor
    that :meth:`Backend.bind_from` binds as it is.

    ``make(backend)`` returns the callable. On a backend the descriptor gives it as a fresh ``functools.partial``
    named ``name``/``qualname`` in ``module`` (what ``hetero explain`` shows), with ``doc`` and ``signature``
    (the op's, without the backend); on the class it is itself, called with the backend first.
    """

    def __init__(
        self,
        make: Callable[[Any], Callable],
        *,
        name: str,
        qualname: str,
        module: str,
        doc: str | None,
        signature: inspect.Signature,
    ):
        self.make, self.__name__, self.__qualname__, self.__module__, self.__doc__ = make, name, qualname, module, doc
        self.op_signature = signature
        self.__signature__ = signature.replace(
            parameters=[inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY), *signature.parameters.values()]
        )

    def __get__(self, backend: Any, owner: type | None = None) -> Callable:
        if backend is None:
            return self
        bound = partial(self.make(backend))
        bound.__name__, bound.__qualname__, bound.__module__ = self.__name__, self.__qualname__, self.__module__
        bound.__doc__, bound.__signature__ = self.__doc__, self.op_signature
        return bound

    def __call__(self, backend: Any, *args: Any, **kwargs: Any) -> Any:
        return self.__get__(backend)(*args, **kwargs)


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run here; ``reason`` says why not (or how, e.g. "interpreted on CPU")."""

    ok: bool
    reason: str = ""
    device_name: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)


class Backend:
    """One implementation of the operator interface for one kind of device.

    A subclass sets the class attributes below and defines a method per op it
    implements, named and typed as in ``hetero.spec``, or binds functions kept in family
    modules with :meth:`bind_from`; every op it does not define resolves to the reference
    backend (``cpu_ref``) and is reported as fallback.
    """

    #: The name users select it by (``hetero.load(name)``, ``HETERO_BACKEND``).
    name: ClassVar[str] = ""
    #: torch device type of the tensors its ops take: "cuda", "npu", "cpu", ...
    device_type: ClassVar[str] = "cpu"
    #: Auto-selection order among available backends: higher wins; the reference is last.
    priority: ClassVar[int] = 0
    #: torch.distributed backend of its collectives: "nccl", "hccl", "gloo".
    dist_backend: ClassVar[str] = "gloo"
    #: The ``hetero.spec.SPEC_VERSION`` this backend was written against (required).
    spec_version: ClassVar[str] = ""
    #: Whether ops check the *contents* of index tensors (``hetero.spec.validate``), which costs a
    #: device-to-host read on an accelerator. ``hetero.load`` sets it per instance (``validate=``,
    #: ``HETERO_VALIDATE``, else on for CPU tensors); a backend that always validates may ignore it.
    validate: bool = False
    #: True when the backend checks index contents itself on every call (the reference does);
    #: otherwise, with ``validate`` on, ``hetero.Ops`` runs ``hetero.spec.validate`` in front of its ops.
    validates_indices: ClassVar[bool] = False

    def __init__(self, device: torch.device | str | None = None):
        self.device = torch.device(device) if device is not None else torch.device(self.device_type)

    @classmethod
    def probe(cls) -> Availability:
        """Whether this backend can run on this machine, and on what. Must not raise; cheap."""
        return Availability(ok=True, device_name=cls.device_type)

    def supports(self, op: str, **static: Any) -> str | None:
        """None if ``op`` runs natively for this static configuration (dtype=..., head_dim=...,
        block_size=...), else the reason it does not. Called once per layer at init, never per call."""
        return None

    def plan_attention(self, meta: Any, *, num_tokens: int, num_blocks: int, block_size: int) -> Any:
        """Optional hook (spec 1.6): prepare one step's ``AttentionMeta`` once for every layer's
        ``paged_attention`` and ``mla_attention`` (host lists, device copies, work partitions),
        for T tokens over caches of NB blocks of BS slots. Whatever it returns reaches those ops as
        ``meta.plan.data`` (``hetero.spec.types.Plan``) when the plan serves their call. It may
        read the metadata's values, and raises ``OpError`` for values it cannot plan. The default
        prepares nothing (None): the ops then work from the metadata alone, as before 1.6."""
        return None

    def plan_recurrent(
        self,
        query_start_loc: torch.Tensor,
        state_slots: torch.Tensor,
        has_initial_state: torch.Tensor,
        *,
        num_tokens: int,
        num_slots: int,
    ) -> Any:
        """Optional hook (spec 1.6): as :meth:`plan_attention`, for the index tensors of the recurrent
        ops (``causal_conv1d``, ``gated_delta_rule``) over T tokens and S state slots; what it returns
        reaches them as ``plan.data``. The default prepares nothing (None). Slots are [N]: per-token
        slots [N, M] (spec 1.11) take no plan, and ``hetero.Ops.plan_recurrent`` refuses them."""
        return None

    @classmethod
    def plans(cls) -> tuple[str, ...]:
        """The plan hooks this class overrides ("attention", "recurrent")."""
        return tuple(
            kind
            for kind in ("attention", "recurrent")
            if getattr(cls, f"plan_{kind}") is not getattr(Backend, f"plan_{kind}")
        )

    @classmethod
    def op_notes(cls) -> Mapping[str, str]:
        """Notes ``hetero explain`` shows per native op (e.g. "never run on an NPU"); none by default."""
        return {}

    @_ClassOrInstanceMethod
    def bind_from(target: "type[Backend] | Backend", *sources: OpSource) -> None:
        """Make the ops ``sources`` provide (see :func:`spec_ops`: a family module's ``__all__``, or a
        mapping ``{op: function}``) ops of this backend; the one way to bind functions as ops.

        On the class, after its body (``MyBackend.bind_from(layers, gemm)``), they are ops of every
        instance: a function becomes a static method (it takes no ``self``); any other callable is set
        as it is, so a descriptor (``TritonBackend``'s kernels) binds to each instance itself. On an
        instance, in ``__init__`` (``self.bind_from({"gemm": cublas_gemm})``), they replace ops of that
        instance only: vendor paths chosen for its device; the class must already have those ops.
        ``hetero explain`` names each function bound; conformance checks its signature against the spec.
        """
        ops = spec_ops(*sources)
        if isinstance(target, type):
            for op, fn in ops.items():
                setattr(target, op, _class_attribute(fn))
            return
        missing = [op for op in ops if op not in type(target).native_ops()]
        if missing:
            raise ValueError(f"{type(target).__name__} has no {', '.join(missing)} to replace on an instance")
        for op, fn in ops.items():
            setattr(target, op, fn)

    @classmethod
    def native_ops(cls) -> tuple[str, ...]:
        """The spec ops this class (or a base other than Backend) defines."""
        return tuple(op for op in OP_NAMES if callable(getattr(cls, op, None)))

    @classmethod
    def process_group_backend(cls) -> str:
        """The torch.distributed backend ``hetero.distributed.init`` starts for this backend in this
        process: ``dist_backend``, unless the backend runs on CPU tensors here (an interpreter)."""
        return cls.dist_backend

    def communicator(self, group: Any = None) -> "Communicator":
        """A ``Communicator`` over a ``torch.distributed`` process group (None: the default group).

        The default group must be initialized, e.g. by ``hetero.distributed.init(backend)``,
        which uses this backend's ``dist_backend``. Its ``recv`` returns tensors on this backend's device.
        """
        from hetero._torch_comm import TorchCommunicator

        return TorchCommunicator(group, device=self.device)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} on {self.device}>"
