"""hetero-torch's native CPU kernels (``csrc/*.cpp``): one extension built on first use.

``torch.utils.cpp_extension`` compiles every source into one module for the host CPU (about
30 s, once per machine and source; kept in torch's extensions directory, named by a hash of the
sources, the flags, the CPU and the Python environment). It holds the expert GEMM of ``_moe_native`` (a Python function)
and the ``hetero_torch_native`` ops of ``_attention_native`` (``torch.ops``, so torch.compile
calls them from its graphs). ``HETERO_TORCH_NATIVE=0`` turns it off; where it cannot be built
(no C++ compiler or OpenMP) the callers warn once and keep torch's operators.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import platform
import sys
import warnings
from pathlib import Path

import torch

__all__ = ["NATIVE", "DTYPES", "extension", "rows"]

#: whether hetero-torch may use its native CPU kernels (read once, at import)
NATIVE = os.environ.get("HETERO_TORCH_NATIVE", "1") != "0"
#: the dtypes the kernels compute in (bfloat16 widened to float32 as it is read, rounded once on output)
DTYPES = (torch.float32, torch.bfloat16)
_CSRC = Path(__file__).parent / "csrc"
_SOURCES = sorted(_CSRC.glob("*.cpp"))
_FLAGS = ["-O3", "-march=native", "-fopenmp"]


def _cpu_tag() -> str:
    """What -march=native compiles for, so that a home directory shared between machines keeps one build per CPU."""
    try:
        flags = next(
            line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith(("flags", "Features"))
        )
    except (OSError, StopIteration):
        flags = platform.processor()
    return platform.machine() + flags


@contextlib.contextmanager
def _ninja_on_path():
    """The ninja that hetero-torch depends on, findable while the build runs (a venv's python run
    without activating the venv has no venv bin on PATH)."""
    try:
        import ninja
    except ImportError:
        yield
        return
    saved = os.environ.get("PATH")
    os.environ["PATH"] = os.pathsep.join(p for p in (ninja.BIN_DIR, saved) if p)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = saved


@functools.cache
def extension() -> tuple[object | None, str | None]:
    """(the built module, None), or (None, why it is not used); the build's failure warns once."""
    if not NATIVE:
        return None, "HETERO_TORCH_NATIVE=0"
    text = "".join(p.read_text() for p in [*_SOURCES, *sorted(_CSRC.glob("*.h"))])
    # sys.prefix: two venvs write different build files (include paths) into the same directory, so one
    # sharing the extensions directory with another would rebuild in turn forever, a lock held all the while
    tag = hashlib.sha256(f"{text}{_FLAGS}{_cpu_tag()}{sys.prefix}".encode()).hexdigest()[:12]
    try:
        from torch.utils.cpp_extension import load

        with _ninja_on_path():
            return load(
                f"hetero_torch_native_{tag}",
                [str(p) for p in _SOURCES],
                extra_cflags=_FLAGS,
                extra_ldflags=["-fopenmp"],
            ), None
    except Exception as e:  # noqa: BLE001  (any build failure leaves the portable path)
        why = f"{type(e).__name__}: {e}".strip().splitlines()[0][:300]
        warnings.warn(
            f"hetero-torch: the native CPU kernels did not build ({why}); torch's operators run instead",
            RuntimeWarning,
            stacklevel=2,
        )
        return None, why


def rows(x: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] with each row's heads contiguous (the kernels' layout; any row stride)."""
    # contiguous() keeps any stride of a size-1 dim (a [T, 1, D] slice of a wider row), clone() resets it
    return x if x.stride(2) == 1 and x.stride(1) == x.shape[2] else x.clone(memory_format=torch.contiguous_format)
