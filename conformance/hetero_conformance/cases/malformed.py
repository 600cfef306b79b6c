"""The robustness catalog: malformed calls of every op, each named ``op/defect``.

Each call starts from a valid call at a small real-ish shape (fresh random
values from the call's seed, never zeros, on the backend's device) and breaks
one thing: an index tensor's contents (block ids, slots, positions, cumulative
lengths, group ends, expert ids, perm, state slots: ``index=True``, caught only with
validation on), or a shape, dtype, rank, type or option (always caught). A
conforming backend raises ``hetero.OpError`` naming the op; the reference names
``arg`` too, which the catalog's own tests check.
"""

from __future__ import annotations

from hetero.spec import OPS
from hetero_conformance.cases import (
    malformed_attention,
    malformed_compress,
    malformed_compressed_attention,
    malformed_dense,
    malformed_dsa,
    malformed_hyper,
    malformed_int4,
    malformed_moe,
    malformed_quant,
    malformed_recurrent,
    malformed_sampling,
    malformed_token_slots,
)
from hetero_conformance.cases._malformed import Base, Corrupt, Draw, Malformed, altered, meta_field, put, swap

__all__ = ["Malformed", "Draw", "Base", "Corrupt", "catalog", "put", "swap", "meta_field", "altered", "DEFAULT"]

#: ``module:function`` of the built-in robustness catalog.
DEFAULT = "hetero_conformance.cases.malformed:catalog"


def catalog() -> list[Malformed]:
    """Every malformed call, ops in spec order; ids are unique."""
    calls = [
        c
        for family in (
            malformed_attention,
            malformed_dense,
            malformed_dsa,
            malformed_moe,
            malformed_quant,
            malformed_recurrent,
            malformed_hyper,
            malformed_compress,
            malformed_compressed_attention,
            malformed_int4,  # spec 1.9: packed int4 weights (W4A16)
            malformed_sampling,  # spec 1.10: rejection_sample
            malformed_token_slots,  # spec 1.11: per-token state slots of the recurrent ops
        )
        for c in family.calls()
    ]
    order = {op: i for i, op in enumerate(OPS)}
    seen: set[str] = set()
    for c in calls:
        if c.id in seen:
            raise ValueError(f"duplicate malformed call id {c.id}")
        seen.add(c.id)
    return sorted(calls, key=lambda c: order[c.op])
