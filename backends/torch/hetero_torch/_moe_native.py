"""fused_moe for CPU float32 and bfloat16 through hetero-torch's own kernel (``csrc/fused_moe.cpp``).

Per expert, torch's CPU ``grouped_mm`` and oneDNN each pay a library call, a thread fork and a
packing step; at a decode step's few rows per expert that costs more than the arithmetic (on
the 2-core build machine the Qwen3-MoE layer of ``benchmarks/engine_vs_vllm.py`` took 2.2 ms
at 64 tokens that way, 1.05 ms through this kernel, 1.0 ms in vLLM's ``cpu_fused_moe``:
``benchmarks/moe_cpu.py``). The kernel runs each projection as one parallel region over
(expert, column panel) tiles, the activation inside the first and the weighted sum after the
second, so a call is one trip into C++.

It is part of hetero-torch's native extension (``_native``); where that is off or cannot be
built, fused_moe keeps the grouped GEMMs. Expert weights are repacked into column panels on
first sight and the panels kept on the weight tensor (``cached_pack``), doubling the experts'
memory like oneDNN packing does. bfloat16 experts stay bfloat16 in their panels (half the bytes
a decode step reads). Where the build has AVX512-BF16, bf16 rows over bf16 experts go through
``vdpbf16ps`` on panels packed in k pairs: the projections and the hidden rows are rounded to bf16
as the spec's r() does, accumulation is float32 (one Qwen3-30B-A3B layer at 16 tokens: 29 ms widening,
24 ms in pairs, vLLM's AMX kernel 23 ms). Elsewhere the kernel widens bf16 weights as it reads them
and computes in float32, the result rounded once to x's dtype. Row-at-a-time kernels lose to
tile GEMMs once experts own many rows (a prefill's): there, in a bf16 call, each expert with
``AMX_ROWS`` (16) pairs or more runs as oneDNN's brgemm ukernel (``at::native::cpublas``, AMX
where the CPU has it) over the same pair panels, which are its VNNI layout, so one packed copy
serves every batch size (``bf16_tiles()``). A build without those tiles keeps the old split: bf16
calls with more than ``BF16_MAX_PAIRS_PER_EXPERT`` pairs an expert take the grouped GEMMs, packed
by oneDNN (the experts then hold a third copy). Measured at Qwen3-30B-A3B's layer (128 experts,
top-8, hidden 2048, intermediate 768) on the 2-core build machine: the pair kernel against the
tiles at 512 and 1024 tokens 309 / 547 ms against 158 / 229 ms; the tiles against the grouped
oneDNN GEMMs, alternating calls, 181 against 177 ms at 1100 tokens, 117 against 146 ms at 256.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from hetero.errors import OpError
from hetero_torch._gemm_packed import DTYPES as PACKED_DTYPES
from hetero_torch._gemm_packed import cached_pack
from hetero_torch._native import DTYPES, extension

__all__ = ["ACTIVATIONS", "BF16_MAX_PAIRS_PER_EXPERT", "native_fused_moe"]

_ATTR = "_hetero_torch_panels"
#: the most (token, slot) pairs an expert, on average, that bf16 calls bring to a kernel without brgemm tiles
BF16_MAX_PAIRS_PER_EXPERT = 6
#: the activations the kernel computes, in the order of its Activation enum
ACTIVATIONS = ("silu", "swiglu_clamp", "swigluoai")


def _panels(w: torch.Tensor, width: int, pairs: bool = False) -> torch.Tensor:
    """[E, N, K] -> [E, ceil(N / width), K, width]: panel b holds columns b*width.. of every row, zero past N.
    ``pairs``: each panel in k pairs instead, [ceil(K / 2), width, 2] (zero past K), shaped [2 * ceil(K / 2), width]."""
    experts, n, k = w.shape
    blocks = -(-n // width)
    if not pairs:
        return F.pad(w, (0, 0, 0, blocks * width - n)).view(experts, blocks, width, k).transpose(2, 3).contiguous()
    k2 = -(-k // 2)
    padded = F.pad(w, (0, 2 * k2 - k, 0, blocks * width - n)).view(experts, blocks, width, k2, 2)
    return padded.permute(0, 1, 3, 2, 4).reshape(experts, blocks, 2 * k2, width)


def _gate_up_panels(w13: torch.Tensor, width: int, pairs: bool = False) -> torch.Tensor:
    """w13 [E, 2I, K] -> gate panel b followed by up panel b, for each b: [E, 2 * ceil(I / width), K, width]."""
    gate, up = (_panels(half, width, pairs) for half in w13.chunk(2, dim=1))
    return torch.stack([gate, up], dim=2).flatten(1, 2)


def native_fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    activation: str,
    alpha: float,
    limit: float | None,
    w13_bias: torch.Tensor | None,
    w2_bias: torch.Tensor | None,
) -> torch.Tensor | None:
    """fused_moe of float inputs whose shapes are validated (the kernel range-checks the ids), or
    None where the native kernel does not apply (then the grouped GEMMs run)."""
    tensors = [t for t in (x, w13, w2, weights, w13_bias, w2_bias) if t is not None]
    if (
        x.device.type != "cpu"
        or w13.dtype not in DTYPES
        or any(t.dtype not in (torch.float32, w13.dtype) for t in tensors)
        or any(t.requires_grad for t in tensors)
    ):
        return None
    module, _ = extension()
    if module is None:
        return None
    if (
        w13.dtype == torch.bfloat16
        and torch.bfloat16 in PACKED_DTYPES
        and not module.bf16_tiles()
        and ids.numel() > BF16_MAX_PAIRS_PER_EXPERT * w13.shape[0]
    ):
        return None
    # bf16 rows over bf16 experts go in k pairs (AVX512-BF16 dot products), where the build has them
    pairs = w13.dtype == torch.bfloat16 and module.bf16_pairs()
    if pairs and x.dtype != torch.bfloat16:
        return None  # float32 rows over experts packed in pairs: the grouped GEMMs, at x's precision
    width = module.panel_width()
    p13 = cached_pack(w13, _ATTR, functools.partial(_gate_up_panels, width=width, pairs=pairs), first_sight=True)
    p2 = cached_pack(w2, _ATTR, functools.partial(_panels, width=width, pairs=pairs), first_sight=True)
    bias = [None if b is None else b.to(torch.float32).contiguous() for b in (w13_bias, w2_bias)]
    try:
        out = module.fused_moe(
            (x if pairs else x.to(torch.float32)).contiguous(),
            ids.contiguous(),
            weights.to(torch.float32).contiguous(),
            p13,
            w2.shape[2],
            p2,
            bias[0],
            bias[1],
            ACTIVATIONS.index(activation),
            alpha,
            math.inf if limit is None else limit,
        )
    except IndexError as e:
        raise OpError("fused_moe", "ids", f"expert ids in [0, {w13.shape[0]})", str(e).splitlines()[0]) from None
    return out.to(x.dtype)
