"""What the recurrent cases draw: the linear-attention geometry of real models, and the per-sequence
batch layout (rows, state slots, has_initial_state) with states full of random values or NaN."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from hetero.verify.inputs.draw import perm, randn, uniform

__all__ = ["Linear", "LINEAR", "Seq", "batch", "gates", "qkv", "nan_fill"]


@dataclass(frozen=True)
class Linear:
    """A linear-attention layer: H key heads of K, HV value heads of V, conv width W; ``kda``: g per key channel."""

    h: int
    k: int
    hv: int
    v: int
    width: int = 4
    kda: bool = False

    @property
    def channels(self) -> int:
        """C of the short convolution: the concatenated q | k | v channels."""
        return 2 * self.h * self.k + self.hv * self.v

    def shard(self, tp: int) -> "Linear":
        """One rank's heads under tensor parallelism of degree ``tp`` (heads split evenly)."""
        return Linear(self.h // tp, self.k, self.hv // tp, self.v, self.width, self.kda)


#: Linear-attention layers of released checkpoints (config.json: linear_num_key_heads, linear_key_head_dim,
#: linear_num_value_heads, linear_value_head_dim, linear_conv_kernel_dim; Kimi: linear_attn_config).
LINEAR = {
    "qwen3-next-80b-a3b": Linear(16, 128, 32, 128),  # GVA 2, C = 8192
    "qwen3.5-0.8b": Linear(16, 128, 16, 128),  # dense, GVA 1, C = 6144
    "qwen3.5-27b": Linear(16, 128, 48, 128),  # dense, GVA 3, C = 10240
    "qwen3.5-35b-a3b": Linear(16, 128, 32, 128),  # MoE, GVA 2
    "qwen3.5-397b-a17b": Linear(16, 128, 64, 128),  # MoE, GVA 4, C = 12288
    "kimi-linear-48b-a3b": Linear(32, 128, 32, 128, kda=True),  # KDA: g per key channel, H = HV, C = 12288
}

#: One sequence of a batch: (rows, state), state one of "init" (has_initial_state, the slot holds a
#: random state), "fresh" (no initial state over a random slot), "nan" (no initial state over a
#: NaN-filled slot: garbage that must never be read), "pad" (slot -1: skipped).
Seq = tuple[int, str]


def batch(gen: torch.Generator, seqs: Sequence[Seq], spare: int = 1) -> tuple[dict[str, torch.Tensor], int, list[int]]:
    """(query_start_loc, state_slots, has_initial_state), the slot count S and the NaN slots.

    S leaves ``spare`` slots no sequence names, and sequences take a random permutation of the
    slots, so a write to a wrong slot (or slot -1 wrapping to the last) changes a compared state.
    """
    real = [i for i, (_, state) in enumerate(seqs) if state != "pad"]
    num_slots = len(real) + spare
    order = perm(gen, num_slots).tolist()
    slots, initial, starts, nan = [], [], [0], []
    for i, (rows, state) in enumerate(seqs):
        slot = order[real.index(i)] if state != "pad" else -1
        slots.append(slot)
        initial.append(state == "init" or (state == "pad" and rows % 2 == 1))  # a padded one may claim either
        starts.append(starts[-1] + rows)
        if state == "nan":
            nan.append(slot)
    index = {
        "query_start_loc": torch.tensor(starts, dtype=torch.int32),
        "state_slots": torch.tensor(slots, dtype=torch.int32),
        "has_initial_state": torch.tensor(initial, dtype=torch.bool),
    }
    return index, num_slots, nan


def qkv(
    gen: torch.Generator, lin: Linear, tokens: int, dtype: torch.dtype, views: bool, normalized: bool
) -> tuple[torch.Tensor, ...]:
    """q, k [T, H, K], v [T, HV, V]. ``views``: slices of one [T, C] tensor, the conv's output as the
    engine splits it (rows C apart, not contiguous). ``normalized``: q and k of unit norm, as a
    caller that normalizes them itself passes them with use_qk_l2norm False."""
    hk = lin.h * lin.k
    mixed = randn(gen, (tokens, lin.channels), torch.float32)
    if normalized:
        for part in (mixed[:, :hk], mixed[:, hk : 2 * hk]):
            rows = part.unflatten(1, (lin.h, lin.k))
            rows /= rows.norm(dim=-1, keepdim=True)
    mixed = mixed.to(dtype)
    q, k, v = mixed.split([hk, hk, lin.hv * lin.v], dim=1)
    out = q.unflatten(1, (lin.h, lin.k)), k.unflatten(1, (lin.h, lin.k)), v.unflatten(1, (lin.hv, lin.v))
    return out if views else tuple(t.contiguous() for t in out)


def gates(gen: torch.Generator, lin: Linear, tokens: int, beta_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """g float32 and beta the way the models compute them from random projections:
    g = -exp(A_log) * softplus(a + dt_bias) (per head, or per key channel for KDA), beta = sigmoid(b).

    A_log spreads the heads' decays from ~0.4 to ~1 per token, so some heads keep their
    initial state over a whole case and others forget it within a few rows.
    """
    width = (lin.hv, lin.k) if lin.kda else (lin.hv,)
    a_log = uniform(gen, (lin.hv,) + (1,) * (len(width) - 1), math.log(0.02), math.log(1.0))
    dt_bias = uniform(gen, width, -3.0, 0.0)
    a = randn(gen, (tokens, *width), torch.float32)
    g = -torch.exp(a_log) * F.softplus(a + dt_bias)
    beta = torch.sigmoid(randn(gen, (tokens, lin.hv), torch.float32)).to(beta_dtype)
    return {"g": g, "beta": beta}


def nan_fill(state: torch.Tensor, nan: list[int]) -> torch.Tensor:
    """The slots in ``nan`` filled with NaN: what an allocator may leave in a recycled slot."""
    for slot in nan:
        state[slot] = float("nan")
    return state
