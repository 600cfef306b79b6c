"""Malformed calls of the recurrent ops (causal_conv1d, gated_delta_rule): broken per-sequence indices
(caught with validation on) and broken shapes, dtypes and options (always caught)."""

from __future__ import annotations

import torch

from hetero_conformance.cases._malformed import Draw, Malformed, put, swap

__all__ = ["calls"]

T, C, W, SLOTS = 5, 24, 4, 4
H, K, HV, V = 2, 16, 4, 8


def _index(d: Draw) -> dict:
    # three sequences: 2 rows continuing slot 2, 1 row from zeros in slot 0, 2 rows of padding
    return {
        "query_start_loc": d.tensor([0, 2, 3, 5]),
        "state_slots": d.tensor([2, 0, -1]),
        "has_initial_state": d.tensor([True, False, True], dtype=torch.bool),
    }


def _conv(d: Draw) -> dict:
    return {
        "x": d.randn(T, C),
        "weight": d.randn(C, W),
        "bias": None,
        "conv_state": d.randn(SLOTS, W - 1, C),
        **_index(d),
        "activation": "silu",
    }


def _gdr(d: Draw) -> dict:
    return {
        "q": d.randn(T, H, K),
        "k": d.randn(T, H, K),
        "v": d.randn(T, HV, V),
        "g": -d.uniform(0.01, 1.0, T, HV),
        "beta": d.uniform(0.0, 1.0, T, HV),
        "ssm_state": d.randn(SLOTS, HV, K, V, dtype=torch.float32),
        **_index(d),
        "scale": K**-0.5,
        "use_qk_l2norm": True,
    }


def _index_calls(op: str, base) -> list[Malformed]:
    """The per-sequence index defects both ops share."""
    return [
        Malformed(op, "query_start_loc_decreasing", base, put("query_start_loc", 2, 1), "query_start_loc", index=True),
        Malformed(op, "query_start_loc_past_T", base, put("query_start_loc", 3, T + 1), "query_start_loc", index=True),
        Malformed(
            op, "query_start_loc_not_from_zero", base, put("query_start_loc", 0, 1), "query_start_loc", index=True
        ),
        Malformed(op, "slot_past_slots", base, put("state_slots", 0, SLOTS), "state_slots", index=True),
        Malformed(op, "slot_below_minus_one", base, put("state_slots", 1, -2), "state_slots", index=True),
        Malformed(
            op, "state_slots_wrong_length", base, swap("state_slots", lambda s, d: s[:-1].clone()), "state_slots"
        ),
        Malformed(
            op,
            "has_initial_state_int",
            base,
            swap("has_initial_state", lambda h, d: h.to(torch.int32)),
            "has_initial_state",
        ),
    ]


def calls() -> list[Malformed]:
    """The recurrent family's malformed calls."""
    c, g = "causal_conv1d", "gated_delta_rule"
    return (
        _index_calls(c, _conv)
        + [
            Malformed(c, "weight_width_one", _conv, swap("weight", lambda w, d: d.randn(C, 1)), "weight"),
            Malformed(
                c,
                "conv_state_wrong_width",
                _conv,
                swap("conv_state", lambda s, d: d.randn(SLOTS, W - 2, C)),
                "conv_state",
            ),
            Malformed(
                c, "conv_state_other_dtype", _conv, swap("conv_state", lambda s, d: s.to(torch.float32)), "conv_state"
            ),
            Malformed(c, "activation_gelu", _conv, swap("activation", lambda a, d: "gelu"), "activation"),
        ]
        + _index_calls(g, _gdr)
        + [
            Malformed(g, "v_heads_not_multiple", _gdr, swap("v", lambda v, d: d.randn(T, 3, V)), "v"),
            Malformed(g, "g_wrong_shape", _gdr, swap("g", lambda x, d: -d.uniform(0.01, 1.0, T, HV, K // 2)), "g"),
            Malformed(g, "ssm_state_bfloat16", _gdr, swap("ssm_state", lambda s, d: s.to(torch.bfloat16)), "ssm_state"),
            Malformed(
                g,
                "ssm_state_wrong_heads",
                _gdr,
                swap("ssm_state", lambda s, d: d.randn(SLOTS, HV // 2, K, V, dtype=torch.float32)),
                "ssm_state",
            ),
            Malformed(g, "use_qk_l2norm_not_bool", _gdr, swap("use_qk_l2norm", lambda u, d: 1), "use_qk_l2norm"),
        ]
    )
