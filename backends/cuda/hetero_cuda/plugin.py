"""The cuda backend: every op through the portable Triton kernels, with vendor paths where they are faster.

Selected as ``hetero.load("cuda")`` (``"cuda:1"`` for device 1). On a GPU the
dense GEMM runs on cuBLAS, bfloat16 grouped GEMM on torch's grouped_mm (sm90),
fp8 GEMM with per-tensor or per-row scales on torch._scaled_mm and dense varlen
attention on flash-attn when installed (see ``hetero_cuda.vendor``); the rest,
and every other input, run the Triton kernels with the sm80/sm90 tuning tables.
Under ``HETERO_TRITON_INTERPRET=1`` the kernels run through Triton's interpreter
on CPU tensors with the vendor paths off, which is how CI checks them.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
from typing import Any

import torch

import hetero
from hetero.kernels import TritonBackend
from hetero_cuda import support, vendor
from hetero_cuda.tuning import CUDA_TUNING

__all__ = ["CudaBackend", "hetero_backends", "MIN_CAPABILITY"]

#: Triton 3 generates code for NVIDIA GPUs of compute capability 7.5 (Turing) and newer.
MIN_CAPABILITY = (7, 5)


def _version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "not installed"


def _no_device_reason() -> str | None:
    """Why this process cannot use an NVIDIA GPU through torch, or None when it can."""
    if torch.version.hip is not None:
        return f"torch {torch.__version__} is a ROCm (HIP {torch.version.hip}) build, not CUDA: use the rocm backend"
    if torch.version.cuda is None:
        return f"torch was built without CUDA (torch {torch.__version__} is a CPU build)"
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return (
            f"no CUDA device visible (torch {torch.__version__} built for CUDA {torch.version.cuda}; "
            "check the driver and CUDA_VISIBLE_DEVICES)"
        )
    return None


class CudaBackend(TritonBackend):
    """NVIDIA GPUs: Triton kernels tuned per architecture, cuBLAS / torch / flash-attn fast paths, NCCL."""

    name = "cuda"
    device_type = "cuda"
    priority = 100
    dist_backend = "nccl"
    tuning = CUDA_TUNING

    def __init__(self, device: torch.device | str | None = None):
        super().__init__(device)
        real_gpu = not self.interpreted and self.device.type == "cuda"
        #: (major, minor) of the device; None under the interpreter or on the meta device.
        self.capability: tuple[int, int] | None = (
            tuple(torch.cuda.get_device_capability(self.device)) if real_gpu else None
        )
        self.vendor_off = vendor.off_reason(self.interpreted, self.device)
        #: op -> vendor implementation bound over the Triton op (empty when the vendor paths are off).
        self.vendor_paths = vendor.bind(self) if self.vendor_off is None else {}
        self.bind_from(self.vendor_paths)

    @classmethod
    def arch(cls, device: torch.device) -> str:
        if device.type != "cuda":
            return "generic"
        major, minor = torch.cuda.get_device_capability(device)
        return f"sm{major}{minor}"

    @classmethod
    def probe(cls) -> hetero.Availability:
        interpreted = cls.probe_interpreter()
        if interpreted is not None:
            return interpreted
        why = _no_device_reason()
        if why:
            return hetero.Availability(ok=False, reason=why)
        index = torch.cuda.current_device()
        cap = tuple(torch.cuda.get_device_capability(index))
        name = torch.cuda.get_device_name(index)
        if cap < MIN_CAPABILITY:
            return hetero.Availability(
                ok=False,
                reason=f"{name} is {support.sm_name(cap)}; Triton needs {support.sm_name(MIN_CAPABILITY)}+",
                device_name=name,
            )
        if importlib.util.find_spec("triton") is None:
            return hetero.Availability(
                ok=False, reason="triton is not installed (pip install triton)", device_name=name
            )
        return hetero.Availability(ok=True, device_name=name, details=cls._details(index, cap))

    @classmethod
    def _details(cls, index: int, cap: tuple[int, int]) -> dict[str, Any]:
        props = torch.cuda.get_device_properties(index)
        return {
            "arch": support.sm_name(cap),
            "compute_capability": f"{cap[0]}.{cap[1]}",
            "devices": torch.cuda.device_count(),
            "memory_gib": round(props.total_memory / 2**30, 1),
            "multiprocessors": props.multi_processor_count,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "triton": _version("triton"),
            "tuning": support.sm_name(cap) if support.sm_name(cap) in cls.tuning.archs else "portable defaults",
            "vendor_paths": vendor.off_reason(False, torch.device("cuda", index)) or "on",
            **vendor.installed(),
        }

    def supports(self, op: str, **static: Any) -> str | None:
        return support.reason(op, static, self.capability)


@hetero.hookimpl
def hetero_backends() -> list[type[hetero.Backend]]:
    return [CudaBackend]
