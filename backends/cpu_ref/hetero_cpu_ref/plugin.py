"""The reference backend: every op of the spec in plain PyTorch, the oracle and the fallback."""

from __future__ import annotations

import platform

import torch

import hetero
from hetero.spec import SPEC_VERSION
from hetero_cpu_ref import (
    attention,
    compress,
    compressed_attention,
    dsa,
    ep,
    gemm,
    hyper,
    layers,
    moe,
    quant,
    recurrent,
    sampling,
)

__all__ = ["CpuRefBackend", "hetero_backends"]


class CpuRefBackend(hetero.Backend):
    """Readable, device-agnostic PyTorch; float32 accumulation, float64 when given float64."""

    name = "cpu_ref"
    device_type = "cpu"
    priority = -1000
    dist_backend = "gloo"
    spec_version = SPEC_VERSION
    validates_indices = True  # every op reads its index arguments on the host before using them

    @classmethod
    def probe(cls) -> hetero.Availability:
        return hetero.Availability(
            ok=True,
            device_name=platform.processor() or platform.machine() or "cpu",
            details={"torch": torch.__version__, "threads": torch.get_num_threads()},
        )


CpuRefBackend.bind_from(
    attention, dsa, gemm, quant, moe, ep, layers, recurrent, hyper, compress, compressed_attention, sampling
)


@hetero.hookimpl
def hetero_backends() -> list[type[hetero.Backend]]:
    return [CpuRefBackend]
