"""Accumulation dtype helpers shared by the torch backend's op families."""

from __future__ import annotations

import torch

__all__ = ["acc_dtype"]


def acc_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """float64 when any input is float64 (the oracle's run), else float32."""
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32
