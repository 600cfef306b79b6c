"""Tolerances per (op, dtype), each with its rationale. Never loosen one to make a backend pass.

A float output passes when, against the float64 oracle:

1. its NaN/Inf pattern equals the oracle's (an empty attention row is -inf in
   lse and 0 in out, never NaN);
2. ``max_abs <= 2 * ref_max_abs + floor * scale``: at most twice the error of
   the reference run in the test dtype on the same inputs, plus a floor relative
   to the output's magnitude (the FlashAttention-3 rule: a kernel may order its
   sums differently, never be much worse than a plain implementation);
3. ``rel_l2 <= max_rel_l2``: an absolute bound per dtype, so a reference that is
   itself inaccurate on some input cannot drag the bound up with it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["Tolerance", "tolerance", "EXACT"]


@dataclass(frozen=True)
class Tolerance:
    floor: float  # relative to max |oracle|
    max_rel_l2: float
    rationale: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


_BY_DTYPE = {
    "float32": Tolerance(1e-5, 1e-5, "fp32 eps 1.2e-7: ~100 ulps of slack for a different summation order, far below any indexing or scaling bug"),
    "float16": Tolerance(1e-3, 5e-3, "fp16 half-ulp 4.9e-4 at 1.0: one rounding of the output plus a little; fp16 accumulation over thousands of terms exceeds it"),
    "bfloat16": Tolerance(8e-3, 2e-2, "bf16 half-ulp 3.9e-3 at 1.0: one or two roundings of the output (kernels round P to bf16 before P@V)"),
    "float8_e4m3fn": Tolerance(8e-3, 2e-2, "fp8 operands are exact inputs; the bf16 output rounding dominates"),
    "float8_e4m3fnuz": Tolerance(8e-3, 2e-2, "fp8 (fnuz) operands are exact inputs; the bf16 output rounding dominates"),
    "int8": Tolerance(8e-3, 2e-2, "int8 products are exact in int32; the bf16 output rounding dominates"),
}

#: Pure data movement (an output the spec compares "exact"); also the distributed checks' copies.
EXACT = Tolerance(0.0, 0.0, "pure data movement: every element must be copied bit for bit")


def tolerance(dtype: str, output_dtype: str | None = None) -> Tolerance:
    """The tolerance of a float output in a case of dtype ``dtype``.

    An output the op stores in a finer float dtype than the case's (route's
    float32 weights in a bfloat16 case) is held to that finer dtype's row: it is
    computed from the same rounded inputs, so the case dtype's slack would hide
    a kernel that rounds it through the coarser type.
    """
    row = _BY_DTYPE[dtype]
    finer = _BY_DTYPE.get(output_dtype) if output_dtype else None
    return finer if finer is not None and finer.max_rel_l2 < row.max_rel_l2 else row
