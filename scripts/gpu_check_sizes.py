"""What the benchmark cases of scripts/gpu_check.py share: the sizes (realistic and smoke), the Bench
record, and the helpers that draw inputs and count bytes.

A :class:`Bench` names an op and a case; ``make(device)`` draws its inputs (bfloat16
unless said) and returns them with the flops it performs and the bytes it must
move at least (every input read once, every output written once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from hetero.spec import AttentionMeta

__all__ = [
    "BF16",
    "Sizes",
    "FULL",
    "SMOKE",
    "Bench",
    "nbytes",
    "randn",
    "paged_meta",
    "visible",
    "windowed",
    "expert_ids",
]

BF16 = torch.bfloat16


@dataclass(frozen=True)
class Sizes:
    decode: tuple[int, int]  # (sequences, KV length)
    heads: tuple[int, int, int]  # (Hq, Hkv, D)
    block: int
    prefill: tuple[int, int]  # (sequences, tokens each)
    mla: tuple[int, int, int]  # (heads, Lkv, rope dim); block size 64
    gemm: int  # M = N = K
    tokens: int  # rows of the layer ops, route and permute
    layer: tuple[int, int]  # (hidden, intermediate)
    experts: dict[str, tuple[int, int, int, int]]  # model -> (E, top_k, H, I)
    routed_rows: int  # grouped_gemm rows (tokens x top_k)
    moe_tokens: tuple[int, ...]
    linear: tuple[int, int, int, int, int, int]  # Gated DeltaNet (H, K, HV, V, conv channels C, conv width W)
    linear_batch: tuple[int, int, int]  # (decode sequences, prefill sequences, prefill tokens each)
    dsa: tuple[int, int, int, int]  # DSA (decode sequences, their KV length, prefill chunk rows, its KV length)
    indexer: tuple[int, int, int]  # the lightning indexer (Hi, D, topk); MLA sizes from ``mla``
    norm: tuple[int, int]  # layer_norm (rows, hidden): the indexer's k_norm
    oss_heads: tuple[int, int, int, int]  # gpt-oss attention (Hq, Hkv, D, sliding window W)
    oss_moe: tuple[int, int, int, int]  # gpt-oss experts (E, top_k, H, I), swigluoai with biases
    quant_tokens: int  # the quantized cases' tokens T (DeepSeek-V3: T x top_k routed rows), gpu_check_quant
    hyper: tuple[int, int]  # hyper-connections (streams N, hidden D): DeepSeek-V4's; tokens from ``tokens``
    w4a16: dict[str, tuple[int, int, int, int, int]]  # packed int4 experts: model -> (E, top_k, H, I, group size)


FULL = Sizes(
    (64, 4096),
    (32, 8, 128),
    16,
    (8, 2048),
    (128, 512, 64),
    4096,
    8192,
    (4096, 12288),
    {"qwen3-30b-a3b": (128, 8, 2048, 768), "deepseek-v3": (256, 8, 7168, 2048)},
    32768,
    (1, 256),
    (16, 128, 32, 128, 8192, 4),
    (64, 8, 4096),  # Qwen3-Next-80B-A3B's linear-attention layers
    (64, 32768, 4096, 8192),
    (64, 128, 2048),
    (8192, 128),  # DeepSeek-V3.2
    (64, 8, 64, 128),
    (32, 4, 2880, 2880),  # gpt-oss-20b
    4096,
    (4, 4096),  # DeepSeek-V4 (HY4: 4 x 2816)
    {"kimi-k2": (384, 8, 7168, 2048, 32), "qwen3-30b-a3b": (128, 8, 2048, 768, 128)},  # K2.5's int4; AWQ / GPTQ
)
SMOKE = Sizes(
    (2, 40),
    (4, 2, 32),
    16,
    (2, 24),
    (4, 64, 16),
    64,
    16,
    (64, 96),
    {"qwen3-30b-a3b": (8, 2, 64, 32), "deepseek-v3": (16, 2, 128, 64)},
    24,
    (1, 4),
    (2, 16, 4, 16, 64, 4),
    (3, 2, 40),
    (2, 40, 8, 12),
    (4, 32, 8),
    (16, 32),
    (4, 2, 32, 8),
    (8, 2, 64, 32),
    12,
    (4, 64),
    {"kimi-k2": (12, 2, 72, 40, 32), "qwen3-30b-a3b": (8, 2, 64, 24, 16)},
)


@dataclass(frozen=True)
class Bench:
    op: str
    case: str
    dtype: str
    make: Callable[[torch.device], tuple[dict[str, Any], float, float]]  # -> (inputs, flops, bytes)


def nbytes(*tensors: torch.Tensor) -> float:
    return float(sum(t.numel() * t.element_size() for t in tensors))


def randn(shape, device, dtype=BF16, scale=1.0) -> torch.Tensor:
    return torch.randn(shape, device=device, dtype=dtype).mul_(scale)  # drawn in bf16: no fp32 copy of 15 GB weights


def paged_meta(qlens: list[int], kvlens: list[int], bs: int, device) -> tuple[AttentionMeta, int]:
    """A meta whose sequences own random, non-contiguous blocks; returns (meta, number of blocks)."""
    need = [math.ceil(n / bs) for n in kvlens]
    perm = torch.randperm(sum(need)).tolist()
    width, rows, at = max(need), [], 0
    for n in need:
        rows.append(perm[at : at + n] + [0] * (width - n))
        at += n
    return AttentionMeta.build(qlens, kvlens, rows, device=device), sum(need)


def visible(n: int, length: int) -> int:
    """Keys seen by n causal query rows at the end of a sequence of ``length``."""
    return n * length - n * (n - 1) // 2


def windowed(n: int, length: int, window: int) -> tuple[int, int]:
    """(keys seen, distinct keys read) by n causal query rows at the end of a sequence of ``length``, each
    row seeing its last ``window`` keys (a Hugging Face sliding window W, its own key included)."""
    seen = sum(min(window, length - n + i + 1) for i in range(n))
    return seen, min(length, n + window - 1)


def expert_ids(tokens: int, e: int, k: int, device) -> torch.Tensor:
    """Distinct expert ids per token, int32 [tokens, k]."""
    return torch.rand(tokens, e).topk(k, dim=1).indices.to(torch.int32).to(device)
