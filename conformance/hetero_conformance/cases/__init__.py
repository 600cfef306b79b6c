"""The case catalog: every op of the spec on real-model shapes and edge cases, per dtype."""

from __future__ import annotations

from hetero.verify.case import Case
from hetero_conformance.cases import (
    attention,
    compress,
    compressed_attention,
    dsa,
    gemm,
    hyper,
    int4,
    int4_moe,
    layers,
    mla,
    mla_sinks,
    moe,
    quant,
    recurrent,
    recurrent_tokens,
    sampling,
    scaled_grouped_gemm,
    spec_verify,
    v4_indexer,
    v4_route,
)

__all__ = ["catalog"]

_FAMILIES = (attention, mla, mla_sinks, dsa, gemm, quant, scaled_grouped_gemm, moe, layers, recurrent, hyper)
_FAMILIES += (v4_indexer, v4_route)  # spec 1.8's options of indexer_topk and route (DeepSeek-V4)
_FAMILIES += (compressed_attention,)  # spec 1.8: DeepSeek-V4's window + compressed attention
_FAMILIES += (compress,)  # spec 1.8: DeepSeek-V4's KV compressor (kv_compress)
_FAMILIES += (int4, int4_moe)  # spec 1.9: packed int4 weights (W4A16) in gemm, grouped_gemm, fused_moe
_FAMILIES += (sampling,)  # spec 1.10: rejection_sample (speculative decoding)
_FAMILIES += (spec_verify,)  # issue 36: 1 + k verification rows per sequence (full tier)
_FAMILIES += (recurrent_tokens,)  # spec 1.11: per-token state slots of the recurrent ops (issue 36)


def catalog(*, quick: bool = False) -> list[Case]:
    """All cases (the full tier), or only those marked quick (the CI tier)."""
    cases = [c for family in _FAMILIES for c in family.cases()]
    seen: set[str] = set()
    for c in cases:
        if c.id in seen:
            raise ValueError(f"duplicate conformance case id {c.id}")
        seen.add(c.id)
    return [c for c in cases if c.quick] if quick else cases
