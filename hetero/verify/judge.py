"""The one verdict rule on an output, shared by the single-process runner and every distributed rank.

A float output (kind ``"float"``) passes when its NaN/Inf pattern equals the
oracle's, ``max_abs <= 2 * reference max_abs + floor * scale`` and
``rel_l2 <= max_rel_l2`` (``tolerances``). Any other kind (``"exact"``,
``"ids_as_sets"`` once sorted) passes only when every element equals the
oracle's, NaN matching NaN.
"""

from __future__ import annotations

from typing import Any

import torch

from hetero.verify.metrics import compare
from hetero.verify.tolerances import Tolerance

__all__ = ["judge"]


def _mismatched(got: torch.Tensor, want: torch.Tensor) -> int:
    g, w = got.detach().cpu(), want.detach().cpu()
    if g.is_floating_point() or w.is_floating_point():
        g, w = g.to(torch.float64), w.to(torch.float64)
        return int((~((g == w) | (g.isnan() & w.isnan()))).sum())
    return int((g.to(torch.int64) != w.to(torch.int64)).sum())


def judge(
    name: str,
    got: torch.Tensor,
    oracle: torch.Tensor,
    reference: torch.Tensor | None,
    kind: str,
    tol: Tolerance,
    report: dict[str, Any],
    problems: list[str],
) -> None:
    """Judge output ``name`` (same shape as ``oracle``): its metrics go to ``report``, what is wrong to ``problems``.

    ``reference`` is the reference implementation's result in the test dtype (None: taken as exact).
    """
    if kind != "float":
        mismatched = _mismatched(got, oracle)
        report[name] = {"kind": kind, "mismatched": mismatched, "numel": oracle.numel()}
        if mismatched:
            problems.append(f"'{name}': {mismatched} of {oracle.numel()} elements differ ({kind})")
        return
    m = compare(got, oracle)
    r = compare(oracle if reference is None else reference, oracle)
    bound = 2 * r.max_abs + tol.floor * m.scale
    report[name] = {
        "kind": kind,
        **m.as_dict(),
        "ref_max_abs": r.max_abs,
        "ref_rel_l2": r.rel_l2,
        "bound_max_abs": bound,
        "bound_rel_l2": tol.max_rel_l2,
    }
    if m.nonfinite_mismatch:
        problems.append(f"'{name}': {m.nonfinite_mismatch} elements NaN/Inf where the oracle is not (or the reverse)")
    if m.max_abs > bound:
        problems.append(
            f"'{name}': max abs error {m.max_abs:.3g} > bound {bound:.3g} (2 x reference {r.max_abs:.3g} + floor)"
        )
    if m.rel_l2 > tol.max_rel_l2:
        problems.append(f"'{name}': relative L2 error {m.rel_l2:.3g} > {tol.max_rel_l2:.3g}")
