"""The reference backend: every op of the spec in plain PyTorch, the oracle and the fallback."""
from __future__ import annotations

import platform

import torch

import hetero
from hetero.spec import SPEC_VERSION

from hetero_cpu_ref import attention, gemm, layers, moe

__all__ = ["CpuRefBackend", "hetero_backends"]


class CpuRefBackend(hetero.Backend):
    """Readable, device-agnostic PyTorch; float32 accumulation, float64 when given float64."""

    name = "cpu_ref"
    device_type = "cpu"
    priority = -1000
    dist_backend = "gloo"
    spec_version = SPEC_VERSION

    @classmethod
    def probe(cls) -> hetero.Availability:
        return hetero.Availability(
            ok=True,
            device_name=platform.processor() or platform.machine() or "cpu",
            details={"torch": torch.__version__, "threads": torch.get_num_threads()},
        )

    write_kv = staticmethod(attention.write_kv)
    paged_attention = staticmethod(attention.paged_attention)
    varlen_attention = staticmethod(attention.varlen_attention)
    write_mla_kv = staticmethod(attention.write_mla_kv)
    mla_attention = staticmethod(attention.mla_attention)
    merge_attention = staticmethod(attention.merge_attention)

    gemm = staticmethod(gemm.gemm)
    scaled_gemm = staticmethod(gemm.scaled_gemm)
    grouped_gemm = staticmethod(gemm.grouped_gemm)

    route = staticmethod(moe.route)
    moe_permute = staticmethod(moe.moe_permute)
    moe_unpermute = staticmethod(moe.moe_unpermute)
    fused_moe = staticmethod(moe.fused_moe)

    rms_norm = staticmethod(layers.rms_norm)
    rotary_embedding = staticmethod(layers.rotary_embedding)
    silu_and_mul = staticmethod(layers.silu_and_mul)


@hetero.hookimpl
def hetero_backends() -> list[type[hetero.Backend]]:
    return [CpuRefBackend]
