"""Inputs of the DSA cases: the models' indexer and sparse-MLA geometry, grid-valued indexer inputs
whose scores are exact in float32, fp8 index keys that round-trip exactly, the edge values of the
fp8 key format, and sparse top-k index rows.

Why a grid: ``indexer_topk``'s result is compared as a set, so a case must have one right answer
under any float32-or-wider evaluation. q and k are multiples of 1/4 with |value| <= 2 (exact in
bf16 and fp16), weights multiples of 2**-10 below 2**-5 in magnitude: every product, partial sum
and score is a multiple of 2**-14 below 2**10, which float32 holds exactly whatever the order
of the sums. Every evaluation then computes the very same scores, and equal scores (the tie
cases draw keys from a small pool on purpose) are exact ties that the spec's rule (the smaller
position first) decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from hetero.verify.inputs.draw import randn

__all__ = [
    "Dsa",
    "DSA",
    "V4_CSA_RATIO",
    "grid",
    "index_weights",
    "fp8_exact_keys",
    "fp8_format",
    "fp8_edge_keys",
    "key_pool",
    "sparse_rows",
]

FP8 = torch.float8_e4m3fn
GROUP, FP8_MAX = 128, 448.0


@dataclass(frozen=True)
class Dsa:
    """A DSA model's indexer (Hi heads of D, top-k) and absorbed sparse MLA (H heads, Lkv, R)."""

    hi: int
    d: int
    topk: int
    heads: int
    lkv: int = 512
    rope: int = 64
    qk_nope: int = 128
    v_head: int = 128
    scale: float = 0.0

    def shard(self, tp: int) -> "Dsa":
        """One rank's MLA heads under tensor parallelism (the indexer is replicated)."""
        return Dsa(
            self.hi, self.d, self.topk, self.heads // tp, self.lkv, self.rope, self.qk_nope, self.v_head, self.scale
        )


def _yarn_scale(qk_head_dim: int, factor: float, mscale_all_dim: float) -> float:
    mscale = 0.1 * mscale_all_dim * torch.log(torch.tensor(factor, dtype=torch.float64)).item() + 1.0
    return qk_head_dim**-0.5 * mscale**2


#: DeepSeek-V3.2 (V3's MLA, yarn factor 40, and a 64-head indexer) and GLM-5 (32 indexer heads;
#: qk_nope 192 and v_head 256 change only the caller's absorption: Lkv 512, R 64 stay).
#: DeepSeek-V4 (spec 1.8): only its CSA indexer (64 heads of 128, top-512 over entries pooled every 4 tokens)
#: is DSA's; its attention is not MLA (``hetero.spec.compressed``), so the MLA fields are unused.
DSA = {
    "deepseek-v3.2": Dsa(hi=64, d=128, topk=2048, heads=128, scale=_yarn_scale(192, 40, 1.0)),
    "glm-5": Dsa(hi=32, d=128, topk=2048, heads=64, qk_nope=192, v_head=256, scale=(192 + 64) ** -0.5),
    "deepseek-v4": Dsa(hi=64, d=128, topk=512, heads=64, scale=512**-0.5),
}
#: DeepSeek-V4's CSA compress ratio m (``compress_rates["compressed_sparse_attention"]``).
V4_CSA_RATIO = 4


def _signs(gen: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randint(0, 2, shape, generator=gen) * 2 - 1


def grid(gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype, top: int = 8) -> torch.Tensor:
    """Multiples of 1/4 in [-top/4, top/4], never 0, in ``dtype``."""
    ints = torch.randint(1, top + 1, shape, generator=gen) * _signs(gen, shape)
    return (ints.float() / 4).to(dtype)


def index_weights(gen: torch.Generator, t: int, hi: int, signed: bool = False) -> torch.Tensor:
    """float32 [T, Hi] multiples of 2**-10 with |w| < 2**-5, positive unless ``signed``."""
    ints = torch.randint(1, 32, (t, hi), generator=gen)
    if signed:
        ints = ints * _signs(gen, (t, hi))
    return ints.float() / 1024


def fp8_exact_keys(gen: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    """float32 keys [..., D] that the fp8 format holds exactly: multiples of 1/4 below 2 with one
    +-1.75 per group of 128, so each scale is 1.75 / 448 = 2**-8 and each value/scale an e4m3 value."""
    keys = grid(gen, shape, torch.float32, top=7)
    groups = keys.unflatten(-1, (-1, GROUP))
    at = torch.randint(0, GROUP, (*groups.shape[:-1], 1), generator=gen)
    groups.scatter_(-1, at, 1.75 * _signs(gen, tuple(at.shape)).float())
    return groups.flatten(-2)


def fp8_format(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 keys [..., D] in the fp8 format of write_index_k: (float8_e4m3fn [..., D], float32 [..., D/128])."""
    groups = keys.float().unflatten(-1, (-1, GROUP))
    scale = groups.abs().amax(dim=-1, keepdim=True).clamp_min(1e-4) / FP8_MAX
    q8 = (groups / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q8.flatten(-2), scale.squeeze(-1)


def _midpoints(dtype: torch.dtype) -> torch.Tensor:
    """The values halfway between neighbouring positive e4m3 values below 448 that ``dtype`` holds exactly."""
    values = torch.arange(0, 127, dtype=torch.uint8).view(FP8).float()
    mids = (values[1:] + values[:-1]) / 2
    return mids[(mids.to(dtype).float() == mids) & (mids > 0.5)]


def fp8_edge_keys(gen: torch.Generator, t: int, d: int, dtype: torch.dtype) -> torch.Tensor:
    """k [T, D] whose rows take turns at the fp8 format's edges: every other value exactly halfway
    between two e4m3 values (ties to even decide it: scale 2**-8 from a 1.75 in the group), a
    group of tiny values (amax below the 1e-4 floor), large values, ordinary ones."""
    k = randn(gen, (t, d), torch.float32)
    mids = _midpoints(dtype)
    for row in range(t):
        kind = row % 4
        if kind == 0:
            pick = mids[torch.randint(0, len(mids), (d,), generator=gen)] * _signs(gen, (d,))
            k[row] = torch.where(torch.arange(d) % 2 == 0, pick / 256, (k[row] * 0.5).clamp(-1.7, 1.7))
            k[row, torch.arange(0, d, GROUP) + 1] = 1.75
        elif kind == 1:
            k[row, :GROUP] *= 1e-5
        elif kind == 2:
            k[row] *= 300.0
    return k.to(dtype)


def key_pool(gen: torch.Generator, shape: tuple[int, ...], pool: int, dtype: torch.dtype) -> torch.Tensor:
    """Keys [*shape, D] each a copy of one of ``pool`` grid vectors [D]: equal scores at many positions."""
    *lead, d = shape
    vectors = grid(gen, (pool, d), dtype)
    return vectors[torch.randint(0, pool, tuple(lead), generator=gen)]


def sparse_rows(
    gen: torch.Generator,
    seqs: Sequence[tuple[int, int]],
    k: int,
    *,
    beyond: int = 0,
    empty: int = 0,
    dtype: torch.dtype = torch.int32,
) -> torch.Tensor:
    """topk_indices [T, K] as indexer_topk leaves them: per row at position pos, min(K, pos + 1)
    distinct positions in [0, pos] in random order, then -1s. ``beyond``: that many of a row's
    entries (when it has room) replaced by positions the row cannot see (pos + 1 .. L - 1, past
    L, far past the cache, or below -1), which must be skipped; ``empty``: the first that many
    rows of the batch are all -1."""
    rows = []
    for n, length in seqs:
        for i in range(n):
            pos = length - n + i
            keep = min(k, pos + 1)
            row = torch.full((k,), -1, dtype=torch.int64)
            row[:keep] = torch.randperm(pos + 1, generator=gen)[:keep]
            if beyond:
                bad = torch.tensor([pos + 1, length + 3, 1 << 30, -2, -(1 << 20)], dtype=torch.int64)
                bad = bad[(bad != pos + 1) | (pos + 1 < length)][:beyond]
                row[-len(bad) :] = bad
            rows.append(row[torch.randperm(k, generator=gen)])
    out = torch.stack(rows) if rows else torch.empty(0, k, dtype=torch.int64)
    out[:empty] = -1
    return out.to(dtype)
