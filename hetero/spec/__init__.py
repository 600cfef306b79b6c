"""The hardware-neutral operator interface: one module per op family, each op a documented signature.

``OPS`` maps every op name to its :class:`OpSpec` in a stable order; a backend
implements an op by defining a method of the same name and signature.

Malformed input, for every op of every backend:

- Shape, dtype, rank and device checks are always on; they read host metadata
  only. A failure raises ``hetero.OpError`` naming the op, the argument, what was
  expected and what came.
- Index-content checks (block ids, slots, positions, cumulative lengths, group
  ends, expert ids, perm, state slots; ``hetero.spec.validate``) read tensor values, a
  device-to-host sync on an accelerator. They run when validation is on
  (``hetero.load(name, validate=True)`` or ``HETERO_VALIDATE=1``; by default on
  for CPU tensors, off on accelerators) and then raise the same ``OpError``.
- With validation off, an op given malformed indices may return anything, but it
  never reads or writes outside its tensors and never kills the process: every
  kernel masks each index it loads from a metadata tensor.
"""

from __future__ import annotations

from types import MappingProxyType, ModuleType

from hetero.spec import attention, compressed, gemm, hyper, layers, moe, recurrent, sampling
from hetero.spec._op import COMPARISONS, OpSpec, Output
from hetero.spec.comm import REDUCE_OPS, Communicator
from hetero.spec.types import FLOAT_DTYPES, AttentionMeta, EPDispatch, Plan

__all__ = [
    "SPEC_VERSION",
    "OPS",
    "OP_NAMES",
    "FAMILIES",
    "OpSpec",
    "Output",
    "COMPARISONS",
    "AttentionMeta",
    "EPDispatch",
    "Plan",
    "Communicator",
    "REDUCE_OPS",
    "FLOAT_DTYPES",
]

#: Semver of the interface and of its checks API (``hetero.spec.checks``). Major: an op's meaning or signature
#: changed, or a check was changed or removed. Minor: ops or checks were added.
SPEC_VERSION = "1.12.0"

_FAMILY_MODULES: tuple[ModuleType, ...] = (attention, gemm, moe, layers, recurrent, hyper, compressed, sampling)


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
