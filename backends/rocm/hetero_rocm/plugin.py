"""The rocm backend: every op through the portable Triton kernels tuned for CDNA, with vendor paths where faster.

Selected as ``hetero.load("rocm")``. torch's ROCm builds expose AMD GPUs through
the "cuda" device type (HIP), and ``torch.distributed``'s "nccl" backend is RCCL
there. On a GPU the dense GEMM runs on hipBLASLt, per-tensor fp8 GEMM on
torch._scaled_mm and dense varlen attention on aiter when installed (see
``hetero_rocm.vendor``); everything else runs the Triton kernels with the
gfx90a/gfx942/gfx950 tuning tables. fp8 is float8_e4m3fnuz on gfx942 (MI300).
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
from typing import Any

import torch

import hetero
from hetero.kernels import TritonBackend
from hetero_rocm import support, vendor
from hetero_rocm.tuning import ROCM_TUNING

__all__ = ["RocmBackend", "hetero_backends", "gfx_arch"]

_TRITON_DISTS = ("pytorch-triton-rocm", "triton")


def gfx_arch(device: torch.device | int) -> str:
    """ "gfx942" for an MI300X (torch reports "gfx942:sramecc+:xnack-")."""
    return torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]


def _triton_version() -> str:
    for dist in _TRITON_DISTS:
        try:
            return f"{dist} {md.version(dist)}"
        except md.PackageNotFoundError:
            continue
    return "not installed"


def _no_device_reason() -> str | None:
    """Why this process cannot use an AMD GPU through torch, or None when it can."""
    if torch.version.hip is None:
        build = f"a CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU build"
        return (
            f"torch was built without ROCm (torch {torch.__version__} is {build}; "
            "install torch from the ROCm wheel index)"
        )
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return (
            f"no ROCm (HIP) device visible (torch {torch.__version__} built for HIP {torch.version.hip}; "
            "check /dev/kfd access and HIP_VISIBLE_DEVICES)"
        )
    return None


class RocmBackend(TritonBackend):
    """AMD Instinct GPUs: Triton kernels tuned per gfx architecture, hipBLASLt / aiter fast paths, RCCL."""

    name = "rocm"
    device_type = "cuda"  # torch's HIP builds use the cuda device type
    priority = 100
    dist_backend = "nccl"  # RCCL in ROCm builds of torch
    tuning = ROCM_TUNING

    def __init__(self, device: torch.device | str | None = None):
        super().__init__(device)
        real_gpu = not self.interpreted and self.device.type == "cuda"
        #: The gfx architecture ("gfx942"); None under the interpreter or on the meta device.
        self.gfx: str | None = self.tune.arch if real_gpu else None
        self.vendor_off = vendor.off_reason(self.interpreted, self.device)
        #: op -> vendor implementation bound over the Triton op (empty when the vendor paths are off).
        self.vendor_paths = vendor.bind(self) if self.vendor_off is None else {}
        self.bind_from(self.vendor_paths)

    @classmethod
    def arch(cls, device: torch.device) -> str:
        return gfx_arch(device) if device.type == "cuda" else "generic"

    @classmethod
    def probe(cls) -> hetero.Availability:
        interpreted = cls.probe_interpreter()
        if interpreted is not None:
            return interpreted
        why = _no_device_reason()
        if why:
            return hetero.Availability(ok=False, reason=why)
        index = torch.cuda.current_device()
        name = torch.cuda.get_device_name(index)
        if importlib.util.find_spec("triton") is None:
            return hetero.Availability(
                ok=False, reason="triton is not installed (ROCm ships it as pytorch-triton-rocm)", device_name=name
            )
        return hetero.Availability(ok=True, device_name=name, details=cls._details(index))

    @classmethod
    def _details(cls, index: int) -> dict[str, Any]:
        props = torch.cuda.get_device_properties(index)
        arch = gfx_arch(index)
        return {
            "arch": arch,
            "devices": torch.cuda.device_count(),
            "compute_units": props.multi_processor_count,
            "memory_gib": round(props.total_memory / 2**30, 1),
            "fp8": ", ".join(support.FP8_BY_ARCH.get(arch, ())) or "none",
            "torch": torch.__version__,
            "hip": torch.version.hip,
            "triton": _triton_version(),
            "tuning": arch if arch in cls.tuning.archs else "portable defaults",
            "vendor_paths": vendor.off_reason(False, torch.device("cuda", index)) or "on",
            **vendor.installed(),
        }

    def supports(self, op: str, **static: Any) -> str | None:
        return support.reason(op, static, self.gfx)


@hetero.hookimpl
def hetero_backends() -> list[type[hetero.Backend]]:
    return [RocmBackend]
