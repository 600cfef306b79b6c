"""What a distributed case is, what a rank knows while it runs one, and how a rank judges its outputs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from hetero.verify.judge import judge
from hetero.verify.tolerances import EXACT, Tolerance

__all__ = ["DistCase", "RankContext", "Skip", "EXACT", "check", "unchanged"]


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
    #: started by the conformance spawner (each rank ends with the run), not under torchrun
    spawned: bool = False

    def gen(self, case: DistCase, rank: int) -> torch.Generator:
        return torch.Generator().manual_seed(case.seed(self.seed) * 131 + rank)


class Skip(Exception):
    """The case does not apply to this world size."""


def check(
    name: str,
    got: torch.Tensor,
    oracle: torch.Tensor,
    ref: torch.Tensor | None,
    tol: Tolerance,
    report: dict[str, Any],
    problems: list[str],
) -> None:
    """The runner's rule (``judge``) after a shape and dtype check; exact when tol is EXACT."""
    if tuple(got.shape) != tuple(oracle.shape) or got.dtype != (ref.dtype if ref is not None else oracle.dtype):
        want_dtype = ref.dtype if ref is not None else oracle.dtype
        problems.append(
            f"'{name}' is {str(got.dtype).removeprefix('torch.')}{list(got.shape)}, "
            f"expected {str(want_dtype).removeprefix('torch.')}{list(oracle.shape)}"
        )
        return
    judge(name, got, oracle, ref, "exact" if tol is EXACT else "float", tol, report, problems)


def unchanged(name: str, x: torch.Tensor, before: torch.Tensor, problems: list[str]) -> None:
    if not torch.equal(x.cpu(), before):
        problems.append(f"modified its input '{name}'")
