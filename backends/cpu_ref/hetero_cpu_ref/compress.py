"""Reference kv_compress (spec 1.8): DeepSeek-V4's KV compressor, written as the spec states it.

Semantics: ``hetero.spec.compressed.kv_compress``. A loop over sequences and, within each, over
the windows that close in this call, one pooled entry at a time; then the state ring takes the
sequence's last raw rows. float32 arithmetic (float64 when an input is float64, the oracle's
run); each entry is rounded once to comp_cache's dtype, the state rows are exact copies.
"""

from __future__ import annotations

import torch

from hetero.spec.checks import check_kv_compress, check_kv_compress_indices
from hetero.spec.types import AttentionMeta
from hetero_cpu_ref._util import acc_dtype, one_intra_op_thread, up

__all__ = ["kv_compress", "window_slots", "rope_tail"]


def window_slots(w: int, m: int, c: int) -> list[tuple[int, int]]:
    """(token q, half) of each slot of window w: with overlap (c = 2) first the previous window's
    tokens in half 0 (Ca), then window w's own in half 1 (Cb); without, window w's in half 0."""
    own = [(w * m + j, c - 1) for j in range(m)]
    return [((w - 1) * m + j, 0) for j in range(m)] + own if c == 2 else own


def rope_tail(y: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """y [D] with its last 2*len(cos) dims rotated in interleaved pairs (2i, 2i+1) by cos/sin [rot/2]."""
    rot = 2 * cos.shape[0]
    head, tail = y[:-rot], y[-rot:]
    y1, y2 = tail[0::2], tail[1::2]
    rotated = torch.stack((y1 * cos - y2 * sin, y2 * cos + y1 * sin), dim=-1).flatten()
    return torch.cat((head, rotated))


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
    m, c, d, r, bsc = ratio, dims.halves, dims.dim, dims.ring, dims.block_size
    acc = acc_dtype(kv, gate, position_bias, norm_weight, cos_sin_cache, comp_cache)
    bias = up(position_bias, acc).view(m, c, d)
    weight, cs = up(norm_weight, acc), up(cos_sin_cache, acc)
    half_rot = dims.rot // 2
    table = meta.block_table.tolist()
    with one_intra_op_thread():
        for b, p in enumerate(slots):
            if p < 0:
                continue  # a padding sequence: nothing read, nothing written
            s, e, length = qsl[b], qsl[b + 1], lens[b]
            start = length - (e - s)

            def row(x: torch.Tensor, state: torch.Tensor, q: int) -> torch.Tensor:
                """Token q's raw row [C, D]: from this call's rows, else from the state ring."""
                raw = x[s + q - start] if q >= start else state[p, q % r]
                return up(raw, acc).view(c, d)

            for w in range(start // m, length // m):  # the windows closing in this call
                present = [(q, h) for q, h in window_slots(w, m, c) if q >= 0]
                logits = torch.stack([row(gate, gate_state, q)[h] + bias[q % m, h] for q, h in present])
                values = torch.stack([row(kv, kv_state, q)[h] for q, h in present])
                pooled = (torch.softmax(logits, dim=0) * values).sum(dim=0)  # per channel, over the slots
                y = pooled * torch.rsqrt(pooled.square().mean() + eps) * weight
                y = rope_tail(y, cs[w * m, :half_rot], cs[w * m, half_rot:])
                comp_cache[table[b][w // bsc], w % bsc] = y.to(comp_cache.dtype)
            for q in range(max(start, length - r), length):  # the ring keeps the last R raw rows
                kv_state[p, q % r] = kv[s + q - start]
                gate_state[p, q % r] = gate[s + q - start]
