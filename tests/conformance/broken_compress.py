"""Planted bugs of kv_compress (spec 1.8), in a compact, independent compressor written the way
transformers' DeepseekV4 compressors are: per sequence, the raw rows it knows (the ring's, then this
call's) laid out from token ``first`` on, every closing window a [C*m] stack of half-rows, one softmax
over it. Its bug-free form must pass every quick case (``make_control``), which shows each planted
bug is the only difference. ``broken_backends.BUGS`` includes ``BUGS`` from here.
"""

from __future__ import annotations

import torch
from _one_op import one_op_plugin

__all__ = ["BUGS", "mini_kv_compress", "make_control"]

_BUG_OPS = {
    # the ring is read only for the previous window's Ca half: a window that began in an earlier
    # call (chunked prefill, decode) loses its earlier rows, as if the partial window was dropped
    "kv_compress_drops_partial_window": "kv_compress",
    # CSA's entry pools only its own window's Cb half: the previous window's Ca rows are left out
    "kv_compress_forgets_overlap": "kv_compress",
    # rope at the window's last token (w+1)*m - 1 instead of its first, w*m
    "kv_compress_rope_at_window_end": "kv_compress",
    # position_bias row of a new token taken from its packed row index in the call, not q % m
    "kv_compress_bias_by_row_index": "kv_compress",
}


def _known(kv, gate, kv_state, gate_state, p, s, start, length, r):
    """(first token, raw kv rows, raw gate rows, packed row of each or -1): the sequence's last R tokens before
    ``start`` from the ring, then this call's."""
    first = max(0, start - r)
    old = [q % r for q in range(first, start)]
    rows_kv = torch.cat((kv_state[p, old], kv[s : s + length - start]))
    rows_gate = torch.cat((gate_state[p, old], gate[s : s + length - start]))
    packed = [-1] * len(old) + list(range(s, s + length - start))
    return first, rows_kv, rows_gate, packed


def mini_kv_compress(bug: str | None):
    """kv_compress; ``bug`` names its one mistake (None: correct)."""

    def kv_compress(kv, gate, position_bias, norm_weight, cos_sin_cache, comp_cache, kv_state, gate_state, meta,
                    state_slots, *, ratio, overlap, eps):  # fmt: skip
        m, c = ratio, 2 if overlap else 1
        d, r = kv.shape[1] // c, c * ratio
        acc = torch.float64 if kv.dtype == torch.float64 else torch.float32
        pb, nw, cs = position_bias.to(acc), norm_weight.to(acc), cos_sin_cache.to(acc)
        qsl, lens, slots = meta.query_start_loc.tolist(), meta.seq_lens.tolist(), state_slots.tolist()
        table, bsc, half_rot = meta.block_table.tolist(), comp_cache.shape[1], cos_sin_cache.shape[1] // 2
        for b, p in enumerate(slots):
            s, length = qsl[b], lens[b]
            start = length - (qsl[b + 1] - s)
            if p < 0 or start == length:
                continue
            first, rk, rg, packed = _known(kv, gate, kv_state, gate_state, p, s, start, length, r)
            for w in range(start // m, length // m):
                slots_ = [((w - 1) * m + j, 0) for j in range(m) if overlap and bug != "kv_compress_forgets_overlap"]
                slots_ += [(w * m + j, c - 1) for j in range(m)]
                keep = [(q, h) for q, h in slots_ if q >= 0 and q >= first]
                if bug == "kv_compress_drops_partial_window":
                    keep = [(q, h) for q, h in keep if q >= start or q < w * m]
                bias_row = [packed[q - first] % m if bug == "kv_compress_bias_by_row_index" and packed[q - first] >= 0
                            else q % m for q, _ in keep]  # fmt: skip
                z = torch.stack([rg[q - first].to(acc).view(c, d)[h] + pb[i].view(c, d)[h]
                                 for (q, h), i in zip(keep, bias_row)])  # fmt: skip
                v = torch.stack([rk[q - first].to(acc).view(c, d)[h] for q, h in keep])
                x = (z.softmax(0) * v).sum(0)
                x = x * torch.rsqrt(x.square().mean() + eps) * nw
                pos = (w + 1) * m - 1 if bug == "kv_compress_rope_at_window_end" else w * m
                cos, sin = cs[pos, :half_rot], cs[pos, half_rot:]
                ev, od = x[d - 2 * half_rot :: 2].clone(), x[d - 2 * half_rot + 1 :: 2].clone()
                x[d - 2 * half_rot :: 2], x[d - 2 * half_rot + 1 :: 2] = ev * cos - od * sin, od * cos + ev * sin
                comp_cache[table[b][w // bsc], w % bsc] = x.to(comp_cache.dtype)
            for q in range(max(start, length - r), length):
                kv_state[p, q % r], gate_state[p, q % r] = kv[s + q - start], gate[s + q - start]

    return staticmethod(kv_compress)


#: bug name -> (the op it breaks, its implementation)
BUGS = {bug: (op, mini_kv_compress(bug)) for bug, op in _BUG_OPS.items()}


def make_control(op: str = "kv_compress"):
    """A plugin providing backend ``control_kv_compress``: the reference with the bug-free mini kv_compress."""
    return one_op_plugin(f"control_{op}", op, mini_kv_compress(None))
