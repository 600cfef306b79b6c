"""Portable Triton kernels shared by every Triton-capable backend (imported lazily: importing
this package does not import Triton; running an op does)."""

from __future__ import annotations

from hetero.kernels._triton import triton_modules
from hetero.kernels.backend import TritonBackend
from hetero.kernels.tuning import PORTABLE_DEFAULTS, Tuning, TuningTable

__all__ = ["TritonBackend", "TuningTable", "Tuning", "PORTABLE_DEFAULTS", "triton_modules"]
