"""The ascend backend: documented torch_npu fused operators, the portable Triton kernels via triton-ascend, HCCL.

Selected as ``hetero.load("ascend")``. The ops in ``support.MAPPED`` call torch_npu; they are
functions in the family modules ``attention``, ``gemm``, ``moe`` and ``layers``, bound below with
``bind_from``, and the ones that hand some calls to the Triton kernel are ``common.WithTriton``. Every
argument conversion lives in ``hetero_ascend.convert`` and is tested on CPU against a reference
written from the torch_npu docs. NONE of the torch_npu paths has run on an NPU yet: the probe
says so and every mapped op's docstring says so. The other ops are the Triton kernels
(TritonBackend) and run only where triton-ascend is installed; otherwise ``supports`` declines
them and the engine falls back to the reference. torch_npu is imported only inside functions
(``common.torch_npu``).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

import hetero
from hetero.kernels import TritonBackend
from hetero_ascend import attention, common, gemm, layers, moe, quant, support

__all__ = ["AscendBackend", "hetero_backends"]


class AscendBackend(TritonBackend):
    """Huawei Ascend NPUs (Atlas A2/A3) through torch_npu; HCCL collectives."""

    name = "ascend"
    device_type = "npu"
    priority = 100
    dist_backend = "hccl"
    spec_version = hetero.SPEC_VERSION
    #: Ops mapped to torch_npu that have never run on an NPU (shown by the probe and by explain).
    UNVERIFIED_OPS = tuple(support.MAPPED)

    @classmethod
    def op_notes(cls) -> dict[str, str]:
        triton = "portable Triton kernel (needs triton-ascend); never run on an NPU"
        notes = {
            op: f"mapped to {support.target(op)}; {support.NEVER_RUN}" if op in support.MAPPED else triton
            for op in cls.native_ops()
        }
        for op in ("ep_dispatch", "ep_combine"):
            notes[op] = (
                f"mapped to {support.target(op)} where its documented limits allow, else the "
                f"portable hetero._ep path; {support.NEVER_RUN}"
            )
        notes.update(attention.NOTES)
        for op, extra in quant.NOTES.items():
            if op in notes:
                notes[op] = f"{notes[op]}; {extra}"
        return notes

    @classmethod
    def probe(cls) -> hetero.Availability:
        if importlib.util.find_spec("torch_npu") is None:
            return hetero.Availability(ok=False, reason="torch_npu is not installed", details=cls._unverified())
        try:
            npu = common.torch_npu()
            count = npu.npu.device_count() if npu.npu.is_available() else 0
        except Exception as e:  # a torch_npu / CANN mismatch raises at import
            return hetero.Availability(
                ok=False, reason=f"torch_npu failed to load: {type(e).__name__}: {e}", details=cls._unverified()
            )
        if count == 0:
            return hetero.Availability(
                ok=False,
                reason="no NPU visible (check the driver and ASCEND_RT_VISIBLE_DEVICES)",
                details=cls._unverified(),
            )
        index = npu.npu.current_device()
        soc = npu.npu.get_device_name(index)
        return hetero.Availability(
            ok=True,
            reason=f"torch_npu paths {support.NEVER_RUN}",
            device_name=soc,
            details={"soc": soc, "devices": count, "torch": torch.__version__, **cls._unverified()},
        )

    @classmethod
    def _unverified(cls) -> dict[str, Any]:
        """The marker `hetero explain ascend` shows: which ops are torch_npu mappings never run on an NPU."""
        return {
            "triton_ascend": support.triton_ascend_version() or "not installed",
            **{op: f"{support.target(op)}; {support.NEVER_RUN}" for op in support.MAPPED},
        }

    def supports(self, op: str, **static: Any) -> str | None:
        return support.reason(op, static, support.triton_ascend_version() is not None)


AscendBackend.bind_from(attention, gemm, moe, layers)


@hetero.hookimpl
def hetero_backends() -> list[type[hetero.Backend]]:
    return [AscendBackend]
