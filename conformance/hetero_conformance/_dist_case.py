"""What a distributed case is, what a rank knows while it runs one, and how a rank judges its outputs."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from hetero_conformance.metrics import compare
from hetero_conformance.tolerances import Tolerance

__all__ = ["DistCase", "RankContext", "Skip", "EXACT", "check", "unchanged"]

EXACT = Tolerance(0.0, 0.0, "pure data movement: every element must be copied bit for bit")


@dataclass(frozen=True)
class DistCase:
    """One distributed check: ``fn(ctx, case)`` returns this rank's (problems, outputs report)."""

    op: str
    family: str
    shape: str
    fn: Callable[["RankContext", "DistCase"], tuple[list[str], dict[str, Any]]]
    params: tuple[tuple[str, Any], ...] = ()
    quick: bool = True
    dtype: str = "float32"

    @property
    def id(self) -> str:
        return f"{self.op}/{self.shape}/{self.dtype}"

    def param(self, key: str, default: Any = None) -> Any:
        return dict(self.params).get(key, default)

    def seed(self, base: int) -> int:
        return (base * 1_000_003 + sum(map(ord, self.id)) * 7919 + len(self.id)) % (2**62)


@dataclass
class RankContext:
    ops: Any
    reference: Any
    comm: Any
    rank: int
    world: int
    seed: int
    scratch: Path

    def gen(self, case: DistCase, rank: int) -> torch.Generator:
        return torch.Generator().manual_seed(case.seed(self.seed) * 131 + rank)


class Skip(Exception):
    """The case does not apply to this world size."""


def check(name: str, got: torch.Tensor, oracle: torch.Tensor, ref: torch.Tensor | None, tol: Tolerance,
          report: dict[str, Any], problems: list[str]) -> None:
    """The runner's rule: max_abs <= 2 x reference + floor x scale, rel_l2 <= bound; exact when tol is EXACT."""
    if tuple(got.shape) != tuple(oracle.shape) or got.dtype != (ref.dtype if ref is not None else oracle.dtype):
        want_dtype = ref.dtype if ref is not None else oracle.dtype
        problems.append(f"'{name}' is {str(got.dtype).removeprefix('torch.')}{list(got.shape)}, "
                        f"expected {str(want_dtype).removeprefix('torch.')}{list(oracle.shape)}")
        return
    if tol is EXACT:
        mismatched = int((~((got.cpu() == oracle.cpu()) | (got.cpu().isnan() & oracle.cpu().isnan()))).sum())
        report[name] = {"kind": "exact", "mismatched": mismatched, "numel": oracle.numel()}
        if mismatched:
            problems.append(f"'{name}': {mismatched} of {oracle.numel()} elements differ (exact)")
        return
    m = compare(got, oracle)
    r = compare(ref, oracle) if ref is not None else compare(oracle, oracle)
    bound = 2 * r.max_abs + tol.floor * m.scale
    report[name] = {"kind": "float", **m.as_dict(), "ref_max_abs": r.max_abs, "ref_rel_l2": r.rel_l2,
                    "bound_max_abs": bound, "bound_rel_l2": tol.max_rel_l2}
    if m.nonfinite_mismatch:
        problems.append(f"'{name}': {m.nonfinite_mismatch} elements NaN/Inf where the oracle is not (or the reverse)")
    if m.max_abs > bound:
        problems.append(f"'{name}': max abs error {m.max_abs:.3g} > bound {bound:.3g} (2 x reference {r.max_abs:.3g} + floor)")
    if m.rel_l2 > tol.max_rel_l2:
        problems.append(f"'{name}': relative L2 error {m.rel_l2:.3g} > {tol.max_rel_l2:.3g}")


def unchanged(name: str, x: torch.Tensor, before: torch.Tensor, problems: list[str]) -> None:
    if not torch.equal(x.cpu(), before):
        problems.append(f"modified its input '{name}'")
