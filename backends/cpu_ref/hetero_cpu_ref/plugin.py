"""The reference backend: every op of the spec in plain PyTorch, the oracle and the fallback."""
from __future__ import annotations

import platform

import torch

import hetero
from hetero.spec import SPEC_VERSION

from hetero_cpu_ref import attention as _attention
from hetero_cpu_ref import dsa as _dsa
from hetero_cpu_ref import ep as _ep
from hetero_cpu_ref import gemm as _gemm
from hetero_cpu_ref import layers as _layers
from hetero_cpu_ref import moe as _moe
from hetero_cpu_ref import quant as _quant
from hetero_cpu_ref import recurrent as _recurrent

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

    write_kv = staticmethod(_attention.write_kv)
    paged_attention = staticmethod(_attention.paged_attention)
    varlen_attention = staticmethod(_attention.varlen_attention)
    write_mla_kv = staticmethod(_attention.write_mla_kv)
    mla_attention = staticmethod(_attention.mla_attention)
    merge_attention = staticmethod(_attention.merge_attention)
    write_index_k = staticmethod(_dsa.write_index_k)
    indexer_topk = staticmethod(_dsa.indexer_topk)

    gemm = staticmethod(_gemm.gemm)
    scaled_gemm = staticmethod(_gemm.scaled_gemm)
    grouped_gemm = staticmethod(_gemm.grouped_gemm)
    quantize_activation = staticmethod(_quant.quantize_activation)
    scaled_grouped_gemm = staticmethod(_quant.scaled_grouped_gemm)

    route = staticmethod(_moe.route)
    moe_permute = staticmethod(_moe.moe_permute)
    moe_unpermute = staticmethod(_moe.moe_unpermute)
    fused_moe = staticmethod(_moe.fused_moe)
    ep_dispatch = staticmethod(_ep.ep_dispatch)
    ep_combine = staticmethod(_ep.ep_combine)

    rms_norm = staticmethod(_layers.rms_norm)
    layer_norm = staticmethod(_layers.layer_norm)
    rotary_embedding = staticmethod(_layers.rotary_embedding)
    silu_and_mul = staticmethod(_layers.silu_and_mul)

    causal_conv1d = staticmethod(_recurrent.causal_conv1d)
    gated_delta_rule = staticmethod(_recurrent.gated_delta_rule)


@hetero.hookimpl
def hetero_backends() -> list[type[hetero.Backend]]:
    return [CpuRefBackend]
