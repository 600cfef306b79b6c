"""Planted bugs of the DSA ops and layer_norm (spec 1.3) and of MLA's sinks (spec 1.7), in a compact,
independent write_index_k, indexer_topk, mla_attention (dense and sparse, with sinks) and layer_norm:
token by token and row by row, keys read through the block table one position at a time. Their
bug-free forms must pass every quick case (``make_control``), which shows each planted bug is the
only difference.
``broken_backends.BUGS`` includes ``BUGS`` from here.
"""

from __future__ import annotations

import torch
from _one_op import one_op_plugin

__all__ = ["BUGS", "mini_write_index_k", "mini_indexer_topk", "mini_mla_attention", "mini_layer_norm", "make_control"]

_FP8, _NEG_INF = torch.float8_e4m3fn, float("-inf")


def _acc(*tensors: torch.Tensor | None) -> torch.dtype:
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def _rows(meta):
    """(row index, sequence's block-table row, its length, the row's position) for every query row."""
    qsl, lens, table = meta.query_start_loc.tolist(), meta.seq_lens.tolist(), meta.block_table.tolist()
    for b, length in enumerate(lens):
        n = qsl[b + 1] - qsl[b]
        for i in range(n):
            yield qsl[b] + i, table[b], length, length - n + i


def _read(cache: torch.Tensor, table_row: list[int], count: int) -> torch.Tensor:
    """Positions 0..count-1 of a sequence, one slot at a time."""
    bs = cache.shape[1]
    return torch.stack([cache[table_row[j // bs], j % bs] for j in range(count)]) if count else cache[0, :0]


def mini_write_index_k(bug: str | None):
    """write_index_k; ``bug`` names its one mistake (None: correct)."""

    def write_index_k(k, index_cache, slot_mapping, *, index_scale=None):
        bs = index_cache.shape[1]
        for t, slot in enumerate(slot_mapping.tolist()):
            if slot < 0:
                continue
            blk, off = divmod(slot, bs)
            if index_scale is None:
                index_cache[blk, off] = k[t].to(index_cache.dtype)
                continue
            x = k[t].to(torch.float32).reshape(-1, 128)
            amax = x.abs().amax(dim=1)
            if bug != "index_k_fp8_scale_not_floored":
                amax = torch.maximum(amax, torch.tensor(1e-4))
            s = amax / 448.0
            index_scale[blk, off] = s.to(index_scale.dtype)
            index_cache[blk, off] = (x / s[:, None]).clamp(-448.0, 448.0).to(_FP8).reshape(-1)

    return staticmethod(write_index_k)


def _order(scores: torch.Tensor, bug: str | None) -> torch.Tensor:
    """Positions by descending score, a tie to the smaller position (the bug: to the larger)."""
    if bug == "indexer_ties_to_larger_position":
        flipped = torch.sort(scores.flip(0), descending=True, stable=True).indices
        return scores.shape[0] - 1 - flipped
    return torch.sort(scores, descending=True, stable=True).indices


def mini_indexer_topk(bug: str | None):
    """indexer_topk; ``bug`` names its one mistake (None: correct)."""

    def indexer_topk(q, weights, index_cache, meta, *, topk, index_scale=None, compress_ratio=1):
        acc = _acc(q, weights, index_scale)
        out = torch.full((q.shape[0], topk), -1, dtype=torch.int32)
        for t, row, length, pos in _rows(meta):
            seen, visible, keep = _seen(length, pos, compress_ratio, topk, bug)
            if index_scale is None:
                keys = _read(index_cache, row, seen).to(acc)
            else:
                raw = _read(index_cache.view(torch.uint8), row, seen).view(_FP8).to(acc)
                keys = (raw.reshape(seen, -1, 128) * _read(index_scale, row, seen).to(acc)[..., None]).reshape(seen, -1)
            logits = q[t].to(acc) @ keys.T  # [Hi, seen]
            if bug != "indexer_relu_missing":
                logits = logits.clamp_min(0)
            w = torch.ones_like(weights[t], dtype=acc) if bug == "indexer_weights_unapplied" else weights[t].to(acc)
            scores = w @ logits
            scores[visible:] = _NEG_INF  # only the keep_ignores_ratio bug reads past the visible keys
            picked = _order(scores, bug)[:keep]
            out[t, : picked.shape[0]] = picked.to(torch.int32)
        return out

    return staticmethod(indexer_topk)


def _seen(length: int, pos: int, m: int, topk: int, bug: str | None) -> tuple[int, int, int]:
    """(keys read, keys visible, keys listed) of a row at ``pos``; over a compressed cache (spec 1.8) the
    cache holds ``length // m`` entries, those with ``j < (pos + 1) // m`` visible."""
    if m == 1:
        visible = min(length, pos + (2 if bug == "indexer_causal_off_by_one" else 1))
        return visible, visible, min(topk, visible)
    visible = (pos + 1) // m
    if bug == "indexer_compressed_sees_next_entry":  # j <= (pos + 1) // m
        visible += 1
    elif bug == "indexer_compressed_sees_open_window":  # j <= pos // m: the entry whose window is still open
        visible = pos // m + 1
    visible = min(visible, length // m)
    if bug == "indexer_compressed_keep_ignores_ratio":  # keep = min(topk, pos + 1) of all entries, masked ones too
        return length // m, visible, min(topk, pos + 1, length // m)
    return visible, visible, min(topk, visible)


def mini_mla_attention(bug: str | None):
    """mla_attention, dense and sparse; ``bug`` names its one mistake (None: correct)."""

    def mla_attention(
        q_nope, q_pe, ckv_cache, kpe_cache, meta, *, scale, causal=True, return_lse=False, topk_indices=None, sinks=None
    ):
        acc = _acc(q_nope)
        t, h, lkv = q_nope.shape
        out = torch.zeros(t, h, lkv, dtype=acc)
        lse = torch.full((t, h), _NEG_INF, dtype=acc)
        sink = _mla_sinks(sinks, topk_indices is not None, bug)
        for r, row, length, pos in _rows(meta):
            ckv, kpe = _read(ckv_cache, row, length).to(acc), _read(kpe_cache, row, length).to(acc)
            allowed = torch.arange(length) <= pos if causal else torch.ones(length, dtype=torch.bool)
            if topk_indices is not None and bug != "sparse_mla_ignores_topk":
                allowed &= torch.isin(torch.arange(length), topk_indices[r].to(torch.int64))
            if not bool(allowed.any()):
                continue
            s = scale * (q_nope[r].to(acc) @ ckv[allowed].T + q_pe[r].to(acc) @ kpe[allowed].T)  # [H, visible]
            lse[r] = torch.logsumexp(s, dim=1)
            denom = lse[r] if sink is None else torch.logaddexp(lse[r], sink.to(acc))
            out[r] = torch.exp(s - denom[:, None]) @ ckv[allowed]
            if sink is not None and bug == "mla_sink_adds_a_value":  # the sink as a key reading the first key's value
                out[r] += torch.exp(sink.to(acc) - denom)[:, None] * ckv[allowed][0]
            if bug == "mla_sinks_in_lse":
                lse[r] = denom
        res = out.to(q_nope.dtype)
        return (res, lse.to(torch.float32)) if return_lse else res

    return staticmethod(mla_attention)


def _mla_sinks(sinks: torch.Tensor | None, sparse: bool, bug: str | None) -> torch.Tensor | None:
    """The sinks [H] the mini mla_attention applies (spec 1.7): None where its bug drops them."""
    if sinks is None or bug == "mla_sinks_ignored":
        return None
    if (bug == "mla_sinks_sparse_only" and not sparse) or (bug == "mla_sinks_dense_only" and sparse):
        return None
    return sinks[:1].expand(sinks.shape[0]) if bug == "mla_sinks_of_head_zero" else sinks


def mini_layer_norm(bug: str | None):
    """layer_norm; ``bug`` names its one mistake (None: correct)."""

    def layer_norm(x, weight, bias, eps):
        acc = _acc(x, weight, bias)
        a = x.to(acc)
        var = a.var(dim=-1, keepdim=True, unbiased=bug == "layer_norm_unbiased_variance")
        y = (a - a.mean(dim=-1, keepdim=True)) / torch.sqrt(var + eps) * weight.to(acc)
        return (y if bias is None else y + bias.to(acc)).to(x.dtype)

    return staticmethod(layer_norm)


_MINI = {
    "write_index_k": mini_write_index_k,
    "indexer_topk": mini_indexer_topk,
    "mla_attention": mini_mla_attention,
    "layer_norm": mini_layer_norm,
}
_BUG_OPS = {
    "indexer_relu_missing": "indexer_topk",
    "indexer_weights_unapplied": "indexer_topk",
    "indexer_causal_off_by_one": "indexer_topk",  # a row at pos also sees key pos + 1
    "indexer_ties_to_larger_position": "indexer_topk",
    # spec 1.8's compressed keys: off by one either way of the closed-window rule, keep counted in tokens
    "indexer_compressed_sees_next_entry": "indexer_topk",
    "indexer_compressed_sees_open_window": "indexer_topk",
    "indexer_compressed_keep_ignores_ratio": "indexer_topk",
    "sparse_mla_ignores_topk": "mla_attention",  # attends to every causal key: dense MLA
    # spec 1.7's sinks: dropped, counted in lse, given a value, dropped by one path, every head given head 0's
    "mla_sinks_ignored": "mla_attention",
    "mla_sinks_in_lse": "mla_attention",
    "mla_sink_adds_a_value": "mla_attention",
    "mla_sinks_sparse_only": "mla_attention",
    "mla_sinks_dense_only": "mla_attention",
    "mla_sinks_of_head_zero": "mla_attention",
    "index_k_fp8_scale_not_floored": "write_index_k",  # a group of tiny values gets a tiny scale
    "layer_norm_unbiased_variance": "layer_norm",  # divides by H - 1
}

#: bug name -> (the op it breaks, its implementation)
BUGS = {bug: (op, _MINI[op](bug)) for bug, op in _BUG_OPS.items()}


def make_control(op: str):
    """A plugin providing backend ``control_<op>``: the reference with the bug-free mini ``op``."""
    return one_op_plugin(f"control_{op}", op, _MINI[op](None))
