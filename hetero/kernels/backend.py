"""TritonBackend: every op of the spec through the portable Triton kernels.

A chip with a Triton compiler gets all ops by subclassing it and setting
``name``, ``device_type``, ``dist_backend``, ``tuning`` (a TuningTable) and, when
its architecture names differ from the default, ``arch()``. Nothing here imports
Triton until an op runs.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Any, ClassVar

import torch

from hetero.backend import Availability, Backend, PerBackendOp
from hetero.kernels._triton import interpreter_requested, triton_missing_reason
from hetero.kernels.limits import kernel_reason
from hetero.kernels.tuning import Tuning, TuningTable
from hetero.spec import OPS, SPEC_VERSION

__all__ = ["TritonBackend", "KERNEL_OPS", "KernelOp"]

#: The spec ops of each module that implements them: a kernel family (``hetero.kernels.<family>``,
#: whose functions take ``tuning=``; ``route`` stays in torch and takes none) or the portable EP ops.
KERNEL_OPS: dict[str, tuple[str, ...]] = {
    "hetero.kernels.cache": ("write_kv", "write_mla_kv", "merge_attention", "write_index_k"),
    "hetero.kernels.attention": ("paged_attention", "varlen_attention", "mla_attention"),
    "hetero.kernels.dsa": ("indexer_topk",),
    "hetero.kernels.gemm": ("gemm", "scaled_gemm", "grouped_gemm"),
    "hetero.kernels.quant": ("quantize_activation", "scaled_grouped_gemm"),
    "hetero.kernels.moe": ("route", "moe_permute", "moe_unpermute", "fused_moe"),
    "hetero.kernels.layers": ("rms_norm", "layer_norm", "rotary_embedding", "silu_and_mul"),
    "hetero.kernels.recurrent": ("causal_conv1d", "gated_delta_rule"),
    "hetero.kernels.hyper": ("hc_pre", "hc_post", "hc_head"),
    "hetero.kernels.compress": ("kv_compress",),
    "hetero.kernels.compressed_attention": ("compressed_attention",),
    "hetero.kernels.sampling": ("rejection_sample",),
    # collectives and index bookkeeping: device-agnostic torch, shared with the reference
    "hetero._ep": ("ep_dispatch", "ep_combine"),
}
_UNTUNED = frozenset({"route", "ep_dispatch", "ep_combine"})


@functools.cache
def _module(name: str) -> ModuleType:
    return importlib.import_module(name)


def _run(module: str, op: str, *args: Any, **kwargs: Any) -> Any:
    # the module is imported on the first call, not at bind time: a kernel module imports Triton
    return getattr(_module(module), op)(*args, **kwargs)


class KernelOp(PerBackendOp):
    """A portable implementation as a TritonBackend op: on a backend, ``partial(module.op, tuning=backend.tune)``
    (no ``tuning`` for route and the EP ops) with the spec's signature, named ``TritonBackend.<op>``."""

    def __init__(self, module: str, op: str):
        tuned = op not in _UNTUNED
        super().__init__(
            lambda backend: functools.partial(_run, module, op, **({"tuning": backend.tune} if tuned else {})),
            name=op,
            qualname=f"TritonBackend.{op}",
            module=__name__,
            doc=f"``{module}.{op}``" + (" with this backend's tuning." if tuned else "."),
            signature=OPS[op].signature,
        )


class TritonBackend(Backend):
    """The portable Triton implementation of every op (``route`` stays in torch)."""

    spec_version = SPEC_VERSION
    tuning: ClassVar[TuningTable] = TuningTable(vendor="portable")

    def __init__(self, device: torch.device | str | None = None):
        if device is None and interpreter_requested():
            device = "cpu"
        super().__init__(device)
        self.interpreted = interpreter_requested()
        arch = "interpreter" if self.interpreted else ("meta" if self.device.type == "meta" else self.arch(self.device))
        self.tune = Tuning(self.tuning, arch, self.interpreted)

    @classmethod
    def arch(cls, device: torch.device) -> str:
        """The tuning-table key of ``device``; the default has none ("generic")."""
        return "generic"

    @classmethod
    def probe_interpreter(cls) -> Availability | None:
        """Under HETERO_TRITON_INTERPRET=1: available on CPU tensors (or why not); else None."""
        if not interpreter_requested():
            return None
        missing = triton_missing_reason()
        if missing:
            return Availability(ok=False, reason=f"HETERO_TRITON_INTERPRET=1 but {missing}")
        return Availability(
            ok=True,
            reason="interpreted on CPU (HETERO_TRITON_INTERPRET=1)",
            device_name="cpu (triton interpreter)",
            details={"arch": "interpreter"},
        )

    @classmethod
    def process_group_backend(cls) -> str:
        # interpreted kernels take CPU tensors, which only gloo moves
        return "gloo" if interpreter_requested() else cls.dist_backend

    def supports(self, op: str, **static: Any) -> str | None:
        """The portable kernels' own limits (dtype families, head dims, options); a vendor
        subclass puts its architecture's limits in front of these."""
        return kernel_reason(op, static)

    @classmethod
    def probe(cls) -> Availability:
        return cls.probe_interpreter() or Availability(
            ok=False, reason="the portable Triton backend needs a subclass for a device"
        )


TritonBackend.bind_from({op: KernelOp(module, op) for module, ops in KERNEL_OPS.items() for op in ops})
