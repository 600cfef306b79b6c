"""A conformance case: one op on one named shape in one dtype, with inputs drawn from a seed."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from hetero.spec import OPS

__all__ = ["Case", "DTYPES", "dtype_name", "Builder"]

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e4m3fnuz": torch.float8_e4m3fnuz,
    "int8": torch.int8,
}

#: Draws a case's inputs on the CPU: (generator, dtype) -> the op's arguments by parameter name.
Builder = Callable[[torch.Generator, torch.dtype], dict[str, Any]]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@dataclass(frozen=True)
class Case:
    """``op/shape/dtype``: ``build`` draws fresh random inputs (never zeros) from the case's seed.

    ``static`` is what an engine would pass to ``supports``/``resolve`` for this
    configuration (dtype, head_dim, block_size, ...). ``quick`` cases form the CI tier.
    ``check`` (statistical cases): ``check(inputs, outputs)`` judges the backend's outputs on their
    own (the message of a failure, else None), besides the comparison with the oracle.
    """

    op: str
    shape: str
    dtype: str
    build: Builder = field(compare=False, repr=False)
    static: Mapping[str, Any] = field(default_factory=dict, compare=False)
    quick: bool = False
    note: str = ""
    check: Callable[[dict[str, Any], dict[str, torch.Tensor]], str | None] | None = field(
        default=None, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"case {self.id}: '{self.op}' is not an op of the spec")
        if self.dtype not in DTYPES:
            raise ValueError(f"case {self.id}: dtype must be one of {', '.join(DTYPES)}")

    @property
    def id(self) -> str:
        return f"{self.op}/{self.shape}/{self.dtype}"

    @property
    def family(self) -> str:
        return OPS[self.op].family

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def seed(self, base: int) -> int:
        """A per-case seed: stable across runs and processes, different for every case."""
        return (zlib.crc32(self.id.encode()) ^ base) & 0x7FFFFFFF

    def inputs(self, base_seed: int) -> dict[str, Any]:
        gen = torch.Generator().manual_seed(self.seed(base_seed))
        return self.build(gen, self.torch_dtype)
