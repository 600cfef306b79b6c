"""The pieces of a malformed call: ``Draw`` (its random arguments), ``Malformed`` and the usual corruptions.

The catalog (``hetero_conformance.cases.malformed``) and its per-family modules build on these.
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass
from typing import Any, Callable

import torch

from hetero.spec import OPS
from hetero.verify.inputs import draw as _draw

__all__ = ["Malformed", "Draw", "Base", "Corrupt", "put", "swap", "meta_field", "altered"]


class Draw:
    """Draws one call's arguments on ``device`` from the call's generator.

    ``ops`` is the backend under test (a case may start from one of its valid
    results, e.g. ep_combine from ep_dispatch); ``comm`` a one-rank communicator,
    made on first use by ``comm_factory``.
    """

    def __init__(
        self, gen: torch.Generator, device: torch.device, ops: Any = None, comm_factory: Callable[[], Any] | None = None
    ):
        self.gen, self.device, self.ops = gen, device, ops
        self._comm_factory, self._comm = comm_factory, None

    def randn(self, *shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return _draw.randn(self.gen, shape, dtype).to(self.device)

    def uniform(self, lo: float, hi: float, *shape: int) -> torch.Tensor:
        return _draw.uniform(self.gen, shape, lo, hi).to(self.device)

    def ints(self, high: int, *shape: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
        """Integers drawn from [0, high)."""
        return torch.randint(0, high, shape, generator=self.gen, dtype=dtype).to(self.device)

    def perm(self, n: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        return _draw.perm(self.gen, n).to(dtype).to(self.device)

    def tensor(self, values: Any, dtype: torch.dtype = torch.int32) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=self.device)

    @property
    def comm(self) -> Any:
        if self._comm is None:
            if self._comm_factory is None:
                raise RuntimeError("this call needs a communicator and none was provided")
            self._comm = self._comm_factory()
        return self._comm


#: Draws a valid call: the op's arguments by parameter name.
Base = Callable[[Draw], dict]
#: Breaks one thing in a valid call's arguments, in place.
Corrupt = Callable[[dict, Draw], None]


@dataclass(frozen=True)
class Malformed:
    """One malformed call: ``base`` draws a valid call, ``corrupt`` breaks ``arg`` in it."""

    op: str
    defect: str
    base: Base = dataclasses.field(compare=False, repr=False)
    corrupt: Corrupt = dataclasses.field(compare=False, repr=False)
    arg: str = ""
    index: bool = False

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"malformed call {self.id}: '{self.op}' is not an op of the spec")

    @property
    def id(self) -> str:
        return f"{self.op}/{self.defect}"

    @property
    def family(self) -> str:
        return OPS[self.op].family

    def seed(self, base: int) -> int:
        """A per-call seed, stable across runs and processes."""
        return (zlib.crc32(self.id.encode()) ^ base) & 0x7FFFFFFF

    def draw(
        self, base_seed: int, device: torch.device, ops: Any = None, comm_factory: Callable[[], Any] | None = None
    ) -> Draw:
        return Draw(torch.Generator().manual_seed(self.seed(base_seed)), torch.device(device), ops, comm_factory)

    def valid(self, draw: Draw) -> dict:
        """The valid call this one is broken from (a catalog test runs it on the reference)."""
        return self.base(draw)

    def inputs(self, draw: Draw) -> dict:
        """The malformed call's arguments."""
        args = self.base(draw)
        self.corrupt(args, draw)
        return args


def put(key: str, index: Any, value: Any) -> Corrupt:
    """A copy of tensor ``args[key]`` with ``[index] = value``."""

    def corrupt(args: dict, d: Draw) -> None:
        args[key] = altered(args[key], index, value)

    return corrupt


def swap(key: str, make: Callable[[Any, Draw], Any]) -> Corrupt:
    """``args[key] = make(old value, draw)``."""

    def corrupt(args: dict, d: Draw) -> None:
        args[key] = make(args.get(key), d)

    return corrupt


def meta_field(name: str, make: Callable[[Any], Any]) -> Corrupt:
    """The AttentionMeta in ``args["meta"]`` with field ``name`` replaced by ``make(old)`` (tensors cloned first)."""

    def corrupt(args: dict, d: Draw) -> None:
        old = getattr(args["meta"], name)
        args["meta"] = dataclasses.replace(
            args["meta"], **{name: make(old.clone() if isinstance(old, torch.Tensor) else old)}
        )

    return corrupt


def altered(t: torch.Tensor, index: Any, value: Any) -> torch.Tensor:
    """``t`` (a fresh copy) with ``[index] = value``."""
    t = t.clone()
    t[index] = value
    return t
