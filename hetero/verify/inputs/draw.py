"""Random inputs for cases: drawn in float32 from the case's generator, never zeros."""

from __future__ import annotations

import torch

__all__ = ["randn", "uniform", "perm"]


def randn(gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """Standard normal values times ``scale``, in ``dtype`` (exact zeros are nudged away)."""
    x = torch.randn(shape, generator=gen, dtype=torch.float32) * scale
    x = torch.where(x == 0, torch.full_like(x, 1e-3), x)
    return x.to(dtype)


def uniform(
    gen: torch.Generator, shape: tuple[int, ...], lo: float, hi: float, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    return (torch.rand(shape, generator=gen, dtype=torch.float32) * (hi - lo) + lo).to(dtype)


def perm(gen: torch.Generator, n: int) -> torch.Tensor:
    """A random permutation of range(n) (int64): random, non-contiguous block ids."""
    return torch.randperm(n, generator=gen)
