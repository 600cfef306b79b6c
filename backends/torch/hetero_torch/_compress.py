"""kv_compress (spec 1.8, DeepSeek-V4's KV compressor) from torch's batched operators.

Semantics: ``hetero.spec.compressed.kv_compress``. The call is validated as the reference does
(shapes, dtypes, devices, then the index values on the host), and the host lists give every
emitted entry (sequence, window) and every slot of its window a source: one of this call's rows
or a row of the sequence's state ring (or none, before token 0). The entries are then pooled at
once in chunks of ``_BUDGET`` gathered elements: two gathers (this call's rows, the ring) per
tensor, a masked softmax over the slots per channel, the RMS norm, the rope of the trailing dims,
one scatter into the cache. The ring is written after every read, one indexed copy per state
tensor. Every tensor is read and written through its own strides.
Accumulation is float32 (float64 when an input is float64).
"""

from __future__ import annotations

import torch

from hetero.spec.checks import check_kv_compress, check_kv_compress_indices
from hetero.spec.types import AttentionMeta
from hetero_torch._layers_util import acc_dtype

__all__ = ["kv_compress"]

#: The most gathered elements (entries x slots x C*D) one chunk of entries holds.
_BUDGET = 1 << 24


def _plan(qsl, lens, slots, m: int, c: int, r: int):
    """Host lists: per entry its (sequence, window, slot p) and per window slot its row of this call
    or its ring row (-1 where it is not from there; both -1: absent); the ring's writes (p, ring row, row)."""
    entries, chunk_rows, ring_rows, writes = [], [], [], []
    offsets = [j - (c - 1) * m for j in range(c * m)]  # slot j holds token w*m + offsets[j]
    for b, p in enumerate(slots):
        if p < 0:
            continue
        s, e, length = qsl[b], qsl[b + 1], lens[b]
        start = length - (e - s)
        for w in range(start // m, length // m):
            tokens = [w * m + o for o in offsets]
            entries.append((b, w, p))
            chunk_rows.append([s + q - start if q >= start else -1 for q in tokens])
            ring_rows.append([q % r if 0 <= q < start else -1 for q in tokens])
        writes += [(p, q % r, s + q - start) for q in range(max(start, length - r), length)]
    return entries, chunk_rows, ring_rows, writes


def _rope_tail(y: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """y [E, D] with its last 2*rot/2 dims rotated in interleaved pairs by cos/sin [E, rot/2]."""
    rot = 2 * cos.shape[1]
    pairs = y[:, -rot:].unflatten(1, (rot // 2, 2))
    y1, y2 = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((y1 * cos - y2 * sin, y2 * cos + y1 * sin), dim=-1).flatten(1)
    return torch.cat((y[:, :-rot], rotated), dim=1)


def kv_compress(
    kv: torch.Tensor,
    gate: torch.Tensor,
    position_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    comp_cache: torch.Tensor,
    kv_state: torch.Tensor,
    gate_state: torch.Tensor,
    meta: AttentionMeta,
    state_slots: torch.Tensor,
    *,
    ratio: int,
    overlap: bool,
    eps: float,
) -> None:
    op = "kv_compress"
    dims = check_kv_compress(
        op, kv, gate, position_bias, norm_weight, cos_sin_cache, comp_cache, kv_state, gate_state, meta, state_slots,
        ratio, overlap, eps,
    )  # fmt: skip
    qsl, lens, slots = check_kv_compress_indices(op, meta, state_slots, ratio, dims)
    m, c, d, r = ratio, dims.halves, dims.dim, dims.ring
    entries, chunk_rows, ring_rows, writes = _plan(qsl, lens, slots, m, c, r)
    dev, bsc = kv.device, dims.block_size
    if entries:
        table = meta.block_table.to(torch.int64).tolist()
        ent = torch.tensor([(table[b][w // bsc], w % bsc, w * m, p) for b, w, p in entries], device=dev)
        rows = torch.tensor(chunk_rows, dtype=torch.int64, device=dev), torch.tensor(ring_rows, device=dev)
        acc = acc_dtype(kv, gate, position_bias, norm_weight, cos_sin_cache, comp_cache)
        half = torch.tensor([0 if j < m and c == 2 else c - 1 for j in range(c * m)], device=dev)
        bias = position_bias.to(acc).unflatten(1, (c, d))[torch.arange(c * m, device=dev) % m, half]  # [J, D]
        step = max(1, _BUDGET // (c * m * d))
        for e0 in range(0, len(entries), step):
            chunk = slice(e0, e0 + step)
            cs = cos_sin_cache.index_select(0, ent[chunk, 2]).to(acc)
            y = _pool((kv, gate), (kv_state, gate_state), ent[chunk, 3], rows[0][chunk], rows[1][chunk], half, bias,
                      norm_weight.to(acc), cs, d, eps, acc)  # fmt: skip
            comp_cache[ent[chunk, 0], ent[chunk, 1]] = y.to(comp_cache.dtype)
    if writes:  # after every read: a window may read a ring row this call overwrites
        p, ring, row = torch.tensor(writes, device=dev).unbind(1)
        kv_state[p, ring] = kv[row]
        gate_state[p, ring] = gate[row]


def _gather(x: torch.Tensor, state: torch.Tensor, p, chunk_rows, ring_rows, half, c: int, d: int) -> torch.Tensor:
    """[E, J, D]: each window slot's half-row, from this call's rows or the ring (0 where absent)."""
    mine = x.unflatten(1, (c, d))[chunk_rows.clamp(min=0), half]
    ring = state.unflatten(2, (c, d))[p[:, None], ring_rows.clamp(min=0), half]
    return torch.where((chunk_rows >= 0)[..., None], mine, ring)


def _pool(rows, states, p, chunk_rows, ring_rows, half, bias, weight, cs, d: int, eps: float, acc):
    """One chunk of entries [E]: pool their slots, RMS-norm, rope the tail; returns y [E, D] in ``acc``."""
    present = ((chunk_rows >= 0) | (ring_rows >= 0))[..., None]
    c = rows[0].shape[1] // d
    v, g = (_gather(x, st, p, chunk_rows, ring_rows, half, c, d).to(acc) for x, st in zip(rows, states))
    logits = (g + bias).masked_fill(~present, float("-inf"))
    pooled = (torch.softmax(logits, dim=1) * v.masked_fill(~present, 0.0)).sum(dim=1)  # an absent row may be NaN
    y = pooled * torch.rsqrt(pooled.square().mean(dim=-1, keepdim=True) + eps) * weight
    return _rope_tail(y, *cs.chunk(2, dim=1))
