"""fused_moe for CPU float32 through hetero-torch's own expert GEMM (``csrc/expert_gemm.cpp``).

Per expert, torch's CPU ``grouped_mm`` and oneDNN each pay a library call, a thread fork and a
packing step; at a decode step's few rows per expert that costs more than the arithmetic (on
the 2-core build machine the Qwen3-MoE layer of ``benchmarks/engine_vs_vllm.py`` took 2.2 ms
at 64 tokens that way, 1.05 ms through this kernel, 1.0 ms in vLLM's ``cpu_fused_moe``:
``benchmarks/moe_cpu.py``). The kernel runs each projection as one parallel region over
(expert, column panel) tiles.

It is built on first use by ``torch.utils.cpp_extension`` (about 25 s, once per machine and
source; kept in torch's extensions directory) for the host CPU. ``HETERO_TORCH_NATIVE=0`` turns
it off; where it cannot be built (no C++ compiler or OpenMP) fused_moe warns once and keeps the
grouped GEMMs. Expert weights are repacked into column panels on first sight and the panels kept
on the weight tensor (``cached_pack``), doubling the experts' memory like oneDNN packing does.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import platform
import warnings
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from hetero_torch._gemm_packed import cached_pack

__all__ = ["NATIVE", "extension", "native_fused_moe"]

#: whether fused_moe may use the native CPU expert GEMM (read once, at import)
NATIVE = os.environ.get("HETERO_TORCH_NATIVE", "1") != "0"
_SOURCE = Path(__file__).parent / "csrc" / "expert_gemm.cpp"
_FLAGS = ["-O3", "-march=native", "-fopenmp"]
_ATTR = "_hetero_torch_panels"


def _cpu_tag() -> str:
    """What -march=native compiles for, so that a home directory shared between machines keeps one build per CPU."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith(("flags", "Features")))
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
    """(the built module, None), or (None, why it is not used)."""
    if not NATIVE:
        return None, "HETERO_TORCH_NATIVE=0"
    tag = hashlib.sha256(f"{_SOURCE.read_text()}{_FLAGS}{_cpu_tag()}".encode()).hexdigest()[:12]
    try:
        from torch.utils.cpp_extension import load

        with _ninja_on_path():
            return load(f"hetero_torch_expert_gemm_{tag}", [str(_SOURCE)], extra_cflags=_FLAGS,
                        extra_ldflags=["-fopenmp"]), None
    except Exception as e:  # noqa: BLE001  (any build failure leaves the portable path)
        why = f"{type(e).__name__}: {e}".strip().splitlines()[0][:300]
        warnings.warn(f"hetero-torch: the native CPU expert GEMM did not build ({why}); fused_moe keeps "
                      "torch's grouped GEMMs", RuntimeWarning, stacklevel=2)
        return None, why


def _panels(w: torch.Tensor, width: int) -> torch.Tensor:
    """[E, N, K] -> [E, ceil(N / width), K, width]: panel b holds columns b*width.. of every row, zero past N."""
    experts, n, k = w.shape
    blocks = -(-n // width)
    return F.pad(w, (0, 0, 0, blocks * width - n)).view(experts, blocks, width, k).transpose(2, 3).contiguous()


def native_fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor,
                     ids: torch.Tensor, activation: Callable[[torch.Tensor], torch.Tensor],
                     w13_bias: torch.Tensor | None, w2_bias: torch.Tensor | None) -> torch.Tensor | None:
    """fused_moe of validated float inputs, or None where the native kernel does not apply (then the
    grouped GEMMs run): ``activation`` maps gate_up [pairs, 2I] to hidden [pairs, I]."""
    tensors = [t for t in (x, w13, w2, weights, w13_bias, w2_bias) if t is not None]
    if (x.device.type != "cpu" or any(t.dtype != torch.float32 for t in tensors)
            or any(t.requires_grad for t in tensors)):
        return None
    module, _ = extension()
    if module is None:
        return None
    pack = functools.partial(_panels, width=module.panel_width())
    p13 = cached_pack(w13, _ATTR, pack, first_sight=True)
    p2 = cached_pack(w2, _ATTR, pack, first_sight=True)
    rows, k = ids.shape
    flat = ids.reshape(-1).to(torch.int32).contiguous()
    bias = [None if b is None else b.contiguous() for b in (w13_bias, w2_bias)]
    gate_up = module.expert_gemm(x.contiguous(), k, flat, p13, w13.shape[1], bias[0])
    y = module.expert_gemm(activation(gate_up).contiguous(), 1, flat, p2, w2.shape[1], bias[1])
    return torch.bmm(weights.unsqueeze(1), y.view(rows, k, w2.shape[1])).squeeze(1)
