"""Inputs of the kv_compress cases (spec 1.8, DeepSeek-V4's KV compressor), and their static options.

A batch is a list of sequences ``(n, start)``: n new tokens from token ``start``, or ``(n, start,
"pad")``: a padding sequence (slot -1) whose rows would close windows if it were read. Each
sequence with a slot gets its own slot among more slots than used, in a random order; the ring of
a continuing sequence (start > 0) holds random raw rows for its last R tokens before ``start``,
and NaN in the rows of tokens before 0 (a start < R), which the op must never read; a fresh
sequence's slot is all NaN. Slots no sequence names hold random rows, so a write to the wrong slot
changes a compared state. The compressed cache is NaN everywhere (every slot the call does not
write must stay so), its blocks a random permutation, padding included. ``cos_sin_cache`` is
DeepSeek-V4's compress rope (theta 160000, interleaved pairs) over every position the batch
reaches; gate logits are of order 1 and position_bias of order 0.5 so that every slot of a window
carries weight.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from hetero.spec.types import AttentionMeta
from hetero.verify.inputs.draw import perm, randn, uniform

__all__ = ["Seq", "COMPRESS_THETA", "cos_sin", "kv_compress", "kv_compress_static"]

Seq = tuple  # (new tokens n, first new token's position[, "pad"])
#: DeepSeek-V4's compress_rope_theta.
COMPRESS_THETA = 160000.0


def cos_sin(positions: int, rot: int, theta: float = COMPRESS_THETA) -> torch.Tensor:
    """float32 [P, rot]: cos of each pair's angle in columns [0, rot/2), sin in [rot/2, rot)."""
    inv = theta ** (-torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    ang = torch.arange(positions, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat((ang.cos(), ang.sin()), dim=1).float()


def _state(gen: torch.Generator, seqs: Sequence[Seq], slot_of: list[int], num_slots: int, r: int, width: int, dtype):
    """A ring [S, R, C*D] as a case wants it (see the module docstring)."""
    state = randn(gen, (num_slots, r, width), dtype)
    for (n, start, *_), p in zip(seqs, slot_of):
        if p < 0:
            continue
        if start == 0:
            state[p] = float("nan")
        elif start < r:
            state[p, start:] = float("nan")  # tokens start-R .. -1 do not exist
    return state


def _table(gen: torch.Generator, seqs: Sequence[Seq], ratio: int, bsc: int) -> tuple[int, list[list[int]]]:
    """(NBc, block table rows): each sequence (padding too) owns its blocks, drawn from a random permutation."""
    need = [max(1, -(-((start + n) // ratio) // bsc)) for n, start, *_ in seqs]
    nbc = sum(need) + 2
    ids = perm(gen, nbc).tolist()
    width, rows, at = max(need, default=1), [], 0
    for k in need:
        rows.append(ids[at : at + k] + ids[at : at + 1] * (width - k))  # padding columns repeat its own block
        at += k
    return nbc, rows


def kv_compress(
    d: int,
    ratio: int,
    overlap: bool,
    seqs: Sequence[Seq],
    *,
    bsc: int = 16,
    rot: int = 64,
    eps: float = 1e-6,
    cos_in_dtype: bool = False,
    fused: bool = False,
):
    """kv_compress on a batch ``seqs``. ``cos_in_dtype``: cos_sin_cache in the case dtype (else
    float32); ``fused``: kv and gate are column views of one [T, 2*C*D] projection (kv | gate)."""
    c = 2 if overlap else 1
    width, r = c * d, c * ratio

    def build(gen: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        t = sum(s[0] for s in seqs)
        lengths = [s[0] + s[1] for s in seqs]
        live = [i for i, s in enumerate(seqs) if s[2:] != ("pad",)]
        num_slots = len(live) + 2
        order = perm(gen, num_slots).tolist()
        slot_of = [order[live.index(i)] if i in live else -1 for i in range(len(seqs))]
        if fused:
            both = randn(gen, (t, 2 * width), dtype)
            kv, gate = both[:, :width], both[:, width:]
        else:
            kv, gate = randn(gen, (t, width), dtype), randn(gen, (t, width), dtype)
        nbc, table = _table(gen, seqs, ratio, bsc)
        positions = max(lengths, default=0) + 1
        cs = cos_sin(positions, rot)
        return {
            "kv": kv,
            "gate": gate,
            "position_bias": randn(gen, (ratio, width), torch.float32, 0.5),
            "norm_weight": uniform(gen, (d,), 0.5, 1.5),
            "cos_sin_cache": cs.to(dtype) if cos_in_dtype else cs,
            "comp_cache": torch.full((nbc, bsc, d), float("nan"), dtype=dtype),
            "kv_state": _state(gen, seqs, slot_of, num_slots, r, width, dtype),
            "gate_state": _state(gen, seqs, slot_of, num_slots, r, width, dtype),
            "meta": AttentionMeta.build([s[0] for s in seqs], lengths, table),
            "state_slots": torch.tensor(slot_of, dtype=torch.int32),
            "ratio": ratio,
            "overlap": overlap,
            "eps": eps,
        }

    return build


def kv_compress_static(dt: str, d: int, ratio: int, overlap: bool, bsc: int) -> dict[str, Any]:
    """What an engine passes to ``supports`` for one compressor."""
    return {"dtype": dt, "head_dim": d, "ratio": ratio, "overlap": overlap, "block_size": bsc}
