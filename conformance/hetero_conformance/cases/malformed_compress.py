"""Malformed calls of kv_compress (spec 1.8): broken index contents (block ids, state slots, lengths,
cos_sin_cache rows: caught with validation on) and broken shapes, dtypes and options (always caught).

The valid call is DeepSeek-V4's CSA compressor (m = 4, overlap) with D shrunk to 16: a chunk of 5
rows continuing at token 7 in slot 2 (it closes entries 1 and 2), a decode row in slot 0 that
closes none, and a padding sequence of 2 rows (slot -1).
"""

from __future__ import annotations

import torch

from hetero.spec.types import AttentionMeta
from hetero_conformance.cases._malformed import Draw, Malformed, meta_field, put, swap

__all__ = ["calls"]

T, D, M, SLOTS, NBC, BSC, P = 8, 16, 4, 3, 4, 2, 16
W, R = 2 * D, 2 * M


def _call(d: Draw) -> dict:
    meta = AttentionMeta.build([5, 1, 2], [12, 6, 9], [[3, 1], [0, 2], [2, 0]], device=d.device)
    return {
        "kv": d.randn(T, W),
        "gate": d.randn(T, W),
        "position_bias": d.randn(M, W, dtype=torch.float32),
        "norm_weight": d.uniform(0.5, 1.5, D),
        "cos_sin_cache": d.uniform(-1.0, 1.0, P, 8),
        "comp_cache": d.randn(NBC, BSC, D),
        "kv_state": d.randn(SLOTS, R, W),
        "gate_state": d.randn(SLOTS, R, W),
        "meta": meta,
        "state_slots": d.tensor([2, 0, -1]),
        "ratio": M,
        "overlap": True,
        "eps": 1e-6,
    }


def _table(rows: list[list[int]]):
    return meta_field("block_table", lambda t: torch.tensor(rows, dtype=t.dtype, device=t.device))


def _decreasing(qsl: torch.Tensor) -> torch.Tensor:
    qsl[2] = 4  # [0, 5, 4, 8]
    return qsl


def _index_calls() -> list[Malformed]:
    k = "kv_compress"
    return [
        Malformed(k, "block_id_past_blocks", _call, _table([[3, NBC], [0, 2], [2, 0]]), "meta.block_table", index=True),
        Malformed(k, "block_id_negative", _call, _table([[-1, 1], [0, 2], [2, 0]]), "meta.block_table", index=True),
        Malformed(k, "block_table_one_column", _call, _table([[3], [0], [2]]), "meta.block_table", index=True),
        Malformed(k, "slot_past_slots", _call, put("state_slots", 0, SLOTS), "state_slots", index=True),
        Malformed(k, "slot_below_minus_one", _call, put("state_slots", 1, -2), "state_slots", index=True),
        Malformed(
            k, "seq_len_below_rows", _call, meta_field("seq_lens", lambda s: s.fill_(4)), "meta.seq_lens", index=True
        ),  # fmt: skip
        Malformed(
            k,
            "query_start_loc_decreasing",
            _call,
            meta_field("query_start_loc", _decreasing),
            "meta.query_start_loc",
            index=True,
        ),  # fmt: skip
        Malformed(
            k, "cos_sin_cache_too_short", _call, swap("cos_sin_cache", lambda c, d: c[:8]), "cos_sin_cache", index=True
        ),  # fmt: skip
    ]


def _shape_calls() -> list[Malformed]:
    k = "kv_compress"
    return [
        Malformed(k, "ratio_zero", _call, swap("ratio", lambda r, d: 0), "ratio"),
        Malformed(k, "ratio_float", _call, swap("ratio", lambda r, d: 4.0), "ratio"),
        Malformed(k, "overlap_int", _call, swap("overlap", lambda o, d: 1), "overlap"),
        Malformed(k, "eps_negative", _call, swap("eps", lambda e, d: -1e-6), "eps"),
        Malformed(k, "kv_odd_width_with_overlap", _call, swap("kv", lambda x, d: d.randn(T, W - 1)), "kv"),
        Malformed(k, "gate_dtype_not_kv", _call, swap("gate", lambda g, d: g.float()), "gate"),
        Malformed(
            k, "position_bias_rows_not_ratio", _call, swap("position_bias", lambda b, d: b[:-1]), "position_bias"
        ),  # fmt: skip
        Malformed(
            k, "position_bias_bfloat16", _call, swap("position_bias", lambda b, d: b.bfloat16()), "position_bias"
        ),  # fmt: skip
        Malformed(k, "norm_weight_wrong_size", _call, swap("norm_weight", lambda w, d: w[:-1]), "norm_weight"),
        Malformed(k, "cos_sin_cache_odd_rot", _call, swap("cos_sin_cache", lambda c, d: c[:, :7]), "cos_sin_cache"),
        Malformed(
            k, "comp_cache_wrong_width", _call, swap("comp_cache", lambda c, d: d.randn(NBC, BSC, W)), "comp_cache"
        ),  # fmt: skip
        Malformed(k, "kv_state_ring_of_m_rows", _call, swap("kv_state", lambda s, d: s[:, :M]), "kv_state"),
        Malformed(k, "gate_state_other_slots", _call, swap("gate_state", lambda s, d: s[:-1]), "gate_state"),
        Malformed(k, "state_slots_wrong_length", _call, swap("state_slots", lambda s, d: s[:-1]), "state_slots"),
        Malformed(k, "state_slots_float", _call, swap("state_slots", lambda s, d: s.float()), "state_slots"),
    ]


def calls() -> list[Malformed]:
    """kv_compress's malformed calls."""
    return _index_calls() + _shape_calls()
