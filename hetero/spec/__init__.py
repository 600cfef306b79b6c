"""The hardware-neutral operator interface: one module per op family, each op a documented signature.

``OPS`` maps every op name to its :class:`OpSpec` in a stable order; a backend
implements an op by defining a method of the same name and signature.
"""
from __future__ import annotations

from types import MappingProxyType, ModuleType

from hetero.spec import attention, gemm, layers, moe
from hetero.spec._op import OpSpec
from hetero.spec.comm import REDUCE_OPS, Communicator
from hetero.spec.types import FLOAT_DTYPES, AttentionMeta, EPDispatch

__all__ = [
    "SPEC_VERSION", "OPS", "OP_NAMES", "FAMILIES", "OpSpec", "AttentionMeta", "EPDispatch",
    "Communicator", "REDUCE_OPS", "FLOAT_DTYPES",
]

#: Semver of the interface. Major: an op's meaning or signature changed. Minor: ops were added.
SPEC_VERSION = "1.1.0"

_FAMILY_MODULES: tuple[ModuleType, ...] = (attention, gemm, moe, layers)


def _collect() -> dict[str, OpSpec]:
    table: dict[str, OpSpec] = {}
    for module in _FAMILY_MODULES:
        for name in module.__all__:
            spec = getattr(getattr(module, name), "__hetero_op__", None)
            if spec is not None:
                table[spec.name] = spec
    return table


OPS = MappingProxyType(_collect())
OP_NAMES: tuple[str, ...] = tuple(OPS)
FAMILIES: tuple[str, ...] = tuple(m.__name__.rsplit(".", 1)[-1] for m in _FAMILY_MODULES)
