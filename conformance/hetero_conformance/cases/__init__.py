"""The case catalog: every op of the spec on real-model shapes and edge cases, per dtype."""

from __future__ import annotations

from hetero.verify.case import Case
from hetero_conformance.cases import (
    attention,
    dsa,
    gemm,
    hyper,
    layers,
    mla,
    mla_sinks,
    moe,
    quant,
    recurrent,
    scaled_grouped_gemm,
)

__all__ = ["catalog"]

_FAMILIES = (attention, mla, mla_sinks, dsa, gemm, quant, scaled_grouped_gemm, moe, layers, recurrent, hyper)


def catalog(*, quick: bool = False) -> list[Case]:
    """All cases (the full tier), or only those marked quick (the CI tier)."""
    cases = [c for family in _FAMILIES for c in family.cases()]
    seen: set[str] = set()
    for c in cases:
        if c.id in seen:
            raise ValueError(f"duplicate conformance case id {c.id}")
        seen.add(c.id)
    return [c for c in cases if c.quick] if quick else cases
