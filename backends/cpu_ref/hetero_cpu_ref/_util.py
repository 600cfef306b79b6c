"""Small helpers shared by the reference op families."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

__all__ = ["acc_dtype", "up", "one_intra_op_thread"]


def acc_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """float64 when any input is float64 (the oracle run), else float32."""
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def up(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x converted to the accumulation dtype (a copy only when the dtype differs)."""
    return x.to(dtype)


@contextlib.contextmanager
def one_intra_op_thread() -> Iterator[None]:
    """Run a loop of many small torch ops on one intra-op thread, restoring the count after.

    A per-token recurrence issues a few ops per row on tensors of tens of thousands of
    elements: too small to split, yet above torch's grain size, so each op hands work to a
    second thread and waits for it. On a busy 2-core machine that wait dominates (a 384-row
    gated_delta_rule case took 14.7 s on two threads and 0.2 s on one).
    """
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
