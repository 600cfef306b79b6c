"""Small helpers shared by the reference op families."""
from __future__ import annotations

import torch

__all__ = ["acc_dtype", "up"]


def acc_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """float64 when any input is float64 (the oracle run), else float32."""
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def up(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x converted to the accumulation dtype (a copy only when the dtype differs)."""
    return x.to(dtype)
