"""Malformed calls of the hyper-connection ops (spec 1.7): hc_pre, hc_post, hc_head.

None of them reads an index from a tensor, so every defect is a shape, dtype, type or option,
always caught. The valid calls are DeepSeek-V4's form (4 streams, Sinkhorn) with D shrunk to 64.
"""

from __future__ import annotations

import torch

from hetero_conformance.cases._malformed import Draw, Malformed, swap

__all__ = ["calls"]

T, N, D = 5, 4, 64
M = N * (N + 2)


def _pre(d: Draw) -> dict:
    return {
        "streams": d.randn(T, N, D),
        "fn": d.randn(M, N * D, dtype=torch.float32),
        "scale": d.uniform(0.5, 2.0, 3),
        "base": d.randn(M, dtype=torch.float32),
        "norm_eps": 1e-6,
        "hc_eps": 1e-6,
        "sinkhorn_iters": 20,
    }


def _post(d: Draw) -> dict:
    return {
        "y": d.randn(T, D),
        "streams": d.randn(T, N, D),
        "post": d.uniform(0.0, 2.0, T, N),
        "comb": d.uniform(0.0, 0.5, T, N, N),
    }


def _head(d: Draw) -> dict:
    return {
        "streams": d.randn(T, N, D),
        "fn": d.randn(N, N * D, dtype=torch.float32),
        "scale": d.uniform(0.5, 2.0, 1),
        "base": d.randn(N, dtype=torch.float32),
        "norm_eps": 1e-6,
        "hc_eps": 1e-6,
    }


def _pre_calls() -> list[Malformed]:
    p = "hc_pre"
    return [
        # HY4's 2N rows given with Sinkhorn on: the comb rows are missing
        Malformed(p, "fn_rows_without_comb", _pre, swap("fn", lambda f, d: f[: 2 * N]), "fn"),
        Malformed(p, "fn_columns_not_n_times_d", _pre, swap("fn", lambda f, d: f[:, :-1]), "fn"),
        Malformed(p, "fn_bfloat16", _pre, swap("fn", lambda f, d: f.to(torch.bfloat16)), "fn"),
        Malformed(p, "scale_two_with_sinkhorn", _pre, swap("scale", lambda s, d: s[:2]), "scale"),
        Malformed(p, "base_wrong_size", _pre, swap("base", lambda b, d: b[:-1]), "base"),
        Malformed(p, "streams_2d", _pre, swap("streams", lambda s, d: s.flatten(1)), "streams"),
        Malformed(p, "streams_integer", _pre, swap("streams", lambda s, d: d.ints(5, T, N, D)), "streams"),
        Malformed(p, "sinkhorn_iters_negative", _pre, swap("sinkhorn_iters", lambda i, d: -1), "sinkhorn_iters"),
        Malformed(p, "sinkhorn_iters_float", _pre, swap("sinkhorn_iters", lambda i, d: 20.0), "sinkhorn_iters"),
        Malformed(p, "norm_eps_zero", _pre, swap("norm_eps", lambda e, d: 0.0), "norm_eps"),
        Malformed(p, "hc_eps_negative", _pre, swap("hc_eps", lambda e, d: -1e-6), "hc_eps"),
        Malformed(p, "post_mult_nan", _pre, swap("post_mult", lambda v, d: float("nan")), "post_mult"),
    ]


def _post_calls() -> list[Malformed]:
    p = "hc_post"
    return [
        Malformed(p, "y_wrong_tokens", _post, swap("y", lambda y, d: y[:-1]), "y"),
        Malformed(p, "y_dtype_not_streams", _post, swap("y", lambda y, d: y.to(torch.float16)), "y"),
        Malformed(p, "post_wrong_streams", _post, swap("post", lambda p_, d: p_[:, :-1]), "post"),
        Malformed(p, "post_bfloat16", _post, swap("post", lambda p_, d: p_.to(torch.bfloat16)), "post"),
        Malformed(p, "comb_not_square", _post, swap("comb", lambda c, d: c[:, :, :-1]), "comb"),
        Malformed(p, "comb_wrong_tokens", _post, swap("comb", lambda c, d: c[:-1]), "comb"),
        Malformed(p, "streams_empty_hidden", _post, swap("streams", lambda s, d: s[:, :, :0]), "streams"),
    ]


def _head_calls() -> list[Malformed]:
    h = "hc_head"
    return [
        Malformed(
            h, "fn_rows_of_hc_pre", _head, swap("fn", lambda f, d: d.randn(2 * N, N * D, dtype=torch.float32)), "fn"
        ),
        Malformed(h, "scale_two", _head, swap("scale", lambda s, d: d.uniform(0.5, 2.0, 2)), "scale"),
        Malformed(h, "base_float16", _head, swap("base", lambda b, d: b.to(torch.float16)), "base"),
        Malformed(h, "streams_no_streams", _head, swap("streams", lambda s, d: s[:, :0]), "streams"),
        Malformed(h, "hc_eps_string", _head, swap("hc_eps", lambda e, d: "1e-6"), "hc_eps"),
    ]


def calls() -> list[Malformed]:
    """The hyper-connection ops' malformed calls."""
    return _pre_calls() + _post_calls() + _head_calls()
