"""Malformed calls of the MoE ops: routing, permutation, the fused expert MLP and expert parallelism."""

from __future__ import annotations

import torch

from hetero_conformance.cases._malformed import Draw, Malformed, put, swap

__all__ = ["calls"]

TOKENS, HIDDEN, E, TOP_K, INTER = 6, 64, 8, 2, 32


def _route(d: Draw) -> dict:
    return {"router_logits": d.randn(TOKENS, E), "top_k": TOP_K}


def _hashed(d: Draw) -> dict:
    """spec 1.8: hash routing, distinct given experts per token."""
    ids = torch.stack([d.perm(E)[:TOP_K] for _ in range(TOKENS)]).to(torch.int32)
    return {**_route(d), "scoring": "sqrtsoftplus", "fixed_ids": ids}


def _permute(d: Draw) -> dict:
    return {"x": d.randn(TOKENS, HIDDEN), "ids": d.ints(E, TOKENS, TOP_K), "num_experts": E}


def _unpermute(d: Draw) -> dict:
    return {
        "y_sorted": d.randn(TOKENS * TOP_K, HIDDEN),
        "perm": d.perm(TOKENS * TOP_K),
        "weights": d.uniform(0.1, 1.0, TOKENS, TOP_K),
    }


def _fused(d: Draw) -> dict:
    return {
        "x": d.randn(TOKENS, HIDDEN),
        "w13": d.randn(E, 2 * INTER, HIDDEN),
        "w2": d.randn(E, HIDDEN, INTER),
        "weights": d.uniform(0.1, 1.0, TOKENS, TOP_K),
        "ids": d.ints(E, TOKENS, TOP_K),
        "w13_bias": d.randn(E, 2 * INTER),
        "w2_bias": d.randn(E, HIDDEN),
    }


def _options(**options: object):
    """Corrupt: set several options of the call at once (an activation with a bad limit or alpha)."""
    return lambda args, d: args.update(options)


def _dispatch(d: Draw) -> dict:
    return {
        "x": d.randn(TOKENS, HIDDEN),
        "ids": d.ints(E, TOKENS, TOP_K),
        "weights": d.uniform(0.1, 1.0, TOKENS, TOP_K),
        "num_experts": E,
        "comm": d.comm,
    }


def _combine(d: Draw) -> dict:
    """A valid ep_combine call: the backend's own ep_dispatch of a valid batch on a one-rank communicator."""
    dispatch = d.ops.ep_dispatch(**_dispatch(d))
    return {"y_local": d.randn(dispatch.x.shape[0], HIDDEN), "dispatch": dispatch}


def _routing_calls() -> list[Malformed]:
    r, p, u = "route", "moe_permute", "moe_unpermute"
    return [
        Malformed(r, "top_k_past_experts", _route, swap("top_k", lambda k, d: E + 1), "top_k"),
        Malformed(r, "scoring_unknown", _route, swap("scoring", lambda s, d: "relu"), "scoring"),
        Malformed(
            r,
            "correction_bias_wrong_size",
            _route,
            swap("correction_bias", lambda b, d: d.randn(E - 1, dtype=torch.float32)),
            "correction_bias",
        ),
        Malformed(
            r,
            "fixed_ids_with_bias",
            _hashed,
            swap("correction_bias", lambda b, d: d.randn(E, dtype=torch.float32)),
            "correction_bias",
        ),
        Malformed(r, "fixed_ids_with_groups", _hashed, lambda a, d: a.update(n_group=2, topk_group=1), "n_group"),
        Malformed(
            r,
            "fixed_ids_extra_column",
            _hashed,
            swap("fixed_ids", lambda i, d: d.ints(E, TOKENS, TOP_K + 1)),
            "fixed_ids",
        ),
        Malformed(r, "fixed_ids_float", _hashed, swap("fixed_ids", lambda i, d: i.float()), "fixed_ids"),
        Malformed(r, "fixed_id_past_E", _hashed, put("fixed_ids", (2, 1), E), "fixed_ids", index=True),
        Malformed(r, "fixed_id_negative", _hashed, put("fixed_ids", (0, 0), -1), "fixed_ids", index=True),
        Malformed(p, "expert_id_negative", _permute, put("ids", (1, 0), -1), "ids", index=True),
        Malformed(p, "expert_id_past_E", _permute, put("ids", (4, 1), E), "ids", index=True),
        Malformed(p, "ids_float", _permute, swap("ids", lambda i, d: i.float()), "ids"),
        Malformed(u, "perm_out_of_range", _unpermute, put("perm", 5, TOKENS * TOP_K), "perm", index=True),
        Malformed(u, "perm_negative", _unpermute, put("perm", 0, -1), "perm", index=True),
        Malformed(
            u,
            "perm_repeated",
            _unpermute,
            lambda a, d: a.update(perm=torch.cat([a["perm"][1:2], a["perm"][1:]])),
            "perm",
            index=True,
        ),
        Malformed(u, "weights_bfloat16", _unpermute, swap("weights", lambda w, d: w.to(torch.bfloat16)), "weights"),
    ]


def _expert_calls() -> list[Malformed]:
    f, ed, ec = "fused_moe", "ep_dispatch", "ep_combine"
    return [
        Malformed(f, "expert_id_past_E", _fused, put("ids", (2, 1), E), "ids", index=True),
        Malformed(f, "expert_id_negative", _fused, put("ids", (5, 0), -3), "ids", index=True),
        Malformed(f, "w2_wrong_shape", _fused, swap("w2", lambda w, d: d.randn(E, HIDDEN, INTER // 2)), "w2"),
        Malformed(f, "activation_unknown", _fused, swap("activation", lambda a, d: "gelu"), "activation"),
        Malformed(f, "silu_with_limit", _fused, swap("limit", lambda v, d: 7.0), "limit"),
        Malformed(f, "swigluoai_without_limit", _fused, _options(activation="swigluoai", limit=None), "limit"),
        Malformed(f, "swiglu_clamp_limit_zero", _fused, _options(activation="swiglu_clamp", limit=0.0), "limit"),
        Malformed(f, "swigluoai_limit_nan", _fused, _options(activation="swigluoai", limit=float("nan")), "limit"),
        Malformed(
            f, "swigluoai_alpha_inf", _fused, _options(activation="swigluoai", limit=7.0, alpha=float("inf")), "alpha"
        ),
        Malformed(f, "w13_bias_wrong_shape", _fused, swap("w13_bias", lambda b, d: d.randn(E, INTER)), "w13_bias"),
        Malformed(
            f,
            "w13_bias_float32",
            _fused,
            swap("w13_bias", lambda b, d: d.randn(E, 2 * INTER, dtype=torch.float32)),
            "w13_bias",
        ),
        Malformed(f, "w2_bias_missing_expert", _fused, swap("w2_bias", lambda b, d: d.randn(E - 1, HIDDEN)), "w2_bias"),
        Malformed(
            f, "w2_bias_per_token", _fused, swap("w2_bias", lambda b, d: d.randn(TOKENS, TOP_K, HIDDEN)), "w2_bias"
        ),
        Malformed(ed, "expert_id_past_E", _dispatch, put("ids", (3, 0), E), "ids", index=True),
        Malformed(ed, "expert_id_negative", _dispatch, put("ids", (0, 1), -1), "ids", index=True),
        Malformed(ed, "comm_not_a_communicator", _dispatch, swap("comm", lambda c, d: "gloo"), "comm"),
        Malformed(ed, "weights_bfloat16", _dispatch, swap("weights", lambda w, d: w.to(torch.bfloat16)), "weights"),
        Malformed(
            ec,
            "y_local_rows_mismatch",
            _combine,
            swap("y_local", lambda y, d: d.randn(y.shape[0] + 1, HIDDEN)),
            "y_local",
        ),
        Malformed(ec, "y_local_integer", _combine, swap("y_local", lambda y, d: d.ints(100, *y.shape) + 1), "y_local"),
        Malformed(ec, "dispatch_not_ep_dispatch", _combine, swap("dispatch", lambda x, d: {"x": x.x}), "dispatch"),
    ]


def calls() -> list[Malformed]:
    """The moe family's malformed calls."""
    return _routing_calls() + _expert_calls()
