"""The Backend base class a plugin subclasses, and the Availability its probe returns."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

import torch

from hetero.spec import OP_NAMES

if TYPE_CHECKING:
    from hetero.spec.comm import Communicator

__all__ = ["Backend", "Availability"]


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
    implements, named and typed as in ``hetero.spec``; every op it does not define
    resolves to the reference backend (``cpu_ref``) and is reported as fallback.
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

    @classmethod
    def op_notes(cls) -> Mapping[str, str]:
        """Notes ``hetero explain`` shows per native op (e.g. "never run on an NPU"); none by default."""
        return {}

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
        which uses this backend's ``dist_backend``.
        """
        from hetero._torch_comm import TorchCommunicator

        return TorchCommunicator(group)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} on {self.device}>"
