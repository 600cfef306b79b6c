"""What the attention and MLA cases share: dtypes, head geometry, DeepSeek's softmax scale and the
paged-cache layout (random block permutations, slot mappings, AttentionMeta)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from hetero.spec.types import AttentionMeta
from hetero.verify.inputs.draw import perm
from hetero.verify.shapes import MODELS

__all__ = ["FLOATS", "QUICK_DTYPES", "Seqs", "Heads", "heads", "MLA_MSCALE", "mla_scale", "blocks", "slots", "meta"]

FLOATS = ("float32", "float16", "bfloat16")
QUICK_DTYPES = ("float32", "bfloat16")

Seqs = Sequence[tuple[int, int]]  # (query rows n, KV length L) per sequence, L >= n for the paged ops


@dataclass(frozen=True)
class Heads:
    """The attention geometry of a model: query heads, KV heads, head dim."""

    hq: int
    hkv: int
    d: int


def heads(model: str) -> Heads:
    m = MODELS[model]
    return Heads(m.heads, m.kv_heads, m.head_dim)


def _yarn_mscale(factor: float, mscale_all_dim: float) -> float:
    """DeepSeek's yarn attention-scale correction; its softmax scale is multiplied by the square."""
    return 0.1 * mscale_all_dim * math.log(factor) + 1.0 if factor > 1 else 1.0


#: DeepSeek rope_scaling: yarn factor 40 with mscale_all_dim 1.0 (V3) and 0.707 (V2-Lite).
MLA_MSCALE = {"deepseek-v3": _yarn_mscale(40, 1.0), "deepseek-v2-lite": _yarn_mscale(40, 0.707)}


def mla_scale(model: str) -> float:
    """DeepSeek's softmax scale: (qk_nope + qk_rope) ** -0.5 times the squared yarn mscale."""
    m = MODELS[model]
    return (m.qk_nope_head_dim + m.qk_rope_head_dim) ** -0.5 * MLA_MSCALE[model] ** 2


def blocks(gen: torch.Generator, kv_lens: Sequence[int], bs: int) -> tuple[int, list[list[int]]]:
    """A cache of NB blocks (more than used) and each sequence's block ids, drawn from a random
    permutation; rows are padded (one column more than the longest needs) with valid, unrelated ids."""
    need = [-(-L // bs) for L in kv_lens]
    used = sum(need)
    nb = used + max(3, used // 2)
    ids = perm(gen, nb).tolist()
    width = max(need, default=0) + 1
    rows, at = [], 0
    for k in need:
        row = ids[at : at + k]
        at += k
        pad = torch.randint(0, nb, (width - k,), generator=gen).tolist()
        rows.append(row + pad)
    return nb, rows


def slots(gen: torch.Generator, seqs: Seqs, bs: int, skipped: int) -> tuple[int, torch.Tensor]:
    """(NB, slot_mapping int64 [T]) of one engine step: sequence b writes positions L-n..L-1 into its
    randomly permuted blocks, and ``skipped`` extra tokens (padding, half of them in the middle of
    the batch, the rest at the end) carry -1."""
    nb, table = blocks(gen, [L for _, L in seqs], bs)
    out = [table[b][p // bs] * bs + p % bs for b, (n, L) in enumerate(seqs) for p in range(L - n, L)]
    middle = skipped // 2
    for _ in range(middle):
        out.insert(int(torch.randint(0, len(out) + 1, (1,), generator=gen)), -1)
    out += [-1] * (skipped - middle)
    return nb, torch.tensor(out, dtype=torch.int64)


def meta(seqs: Seqs, table: list[list[int]]) -> AttentionMeta:
    return AttentionMeta.build([n for n, _ in seqs], [L for _, L in seqs], table)
