"""Cases of the hyper-connection ops (spec 1.7): hc_pre, hc_post, hc_head.

Hunyuan HY4 (hidden 2816, 4 streams, no Sinkhorn: post_mult = hc_magnitude 2.0, post_eps = hc_eps,
norm eps 1e-5) and DeepSeek-V4 (hidden 4096, 4 streams, 20 Sinkhorn iterations, post_eps 0, norm eps
1e-6); hc_eps 1e-6 in both. Edge cases: T = 0, 1 and 37 tokens, 1 and 3 Sinkhorn iterations, a tiny
(64) and a non-power-of-two (200) hidden size, post_mult 1.5, large eps (0.05: a dropped eps shows
above the tolerance, which the models' 1e-6 would not), large-magnitude and strided streams.
Tolerances are the dtype defaults: post and comb are float32 outputs and take the float32 row.
"""

from __future__ import annotations

from hetero.verify.case import Case
from hetero.verify.inputs import hyper as draw

__all__ = ["cases"]

FLOATS = ("float32", "float16", "bfloat16")

N = 4  # hc_mult of both models
HY4_D, HY4_NORM_EPS = 2816, 1e-5
DSV4_D, DSV4_NORM_EPS, DSV4_ITERS = 4096, 1e-6, 20
HC_EPS = 1e-6


def _hy4(tokens: int, d: int = HY4_D, **kw):
    return draw.hc_pre(tokens, N, d, **{"norm_eps": HY4_NORM_EPS, "hc_eps": HC_EPS, "post_eps": HC_EPS, **kw})


def _dsv4(tokens: int, d: int = DSV4_D, iters: int = DSV4_ITERS, **kw):
    return draw.hc_pre(tokens, N, d, **{"sinkhorn_iters": iters, "norm_eps": DSV4_NORM_EPS, "hc_eps": HC_EPS, **kw})


def _pre_cases(dt: str) -> list[Case]:
    quick = dt in ("float32", "bfloat16")
    big = dict(hc_eps=0.05, post_eps=0.05, post_mult=1.5)
    rows = [  # (shape, builder, hidden, sinkhorn iterations, quick)
        ("hy4.t7", _hy4(7), HY4_D, 0, quick),
        ("deepseek-v4.t7.sinkhorn20", _dsv4(7), DSV4_D, DSV4_ITERS, quick),
        ("hy4.t1", _hy4(1), HY4_D, 0, False),
        ("deepseek-v4.t1.sinkhorn20", _dsv4(1), DSV4_D, DSV4_ITERS, False),
        ("hy4.t37", _hy4(37), HY4_D, 0, False),
        ("deepseek-v4.t37.sinkhorn20", _dsv4(37), DSV4_D, DSV4_ITERS, dt == "bfloat16"),
        ("hy4.t0", _hy4(0), HY4_D, 0, False),
        ("deepseek-v4.t0.sinkhorn20", _dsv4(0), DSV4_D, DSV4_ITERS, False),
        ("d64.t9.sinkhorn1", _dsv4(9, 64, 1), 64, 1, quick),
        ("d200.t9.sinkhorn3", _dsv4(9, 200, 3), 200, 3, quick),
        ("d200.t6.sinkhorn3.eps0.05.post-mult1.5", _dsv4(6, 200, 3, **big), 200, 3, quick),
        ("hy4.t6.eps0.05.post-mult1.5", _hy4(6, **big), HY4_D, 0, quick),
        ("hy4.t5.magnitude256", _hy4(5, magnitude=256.0), HY4_D, 0, False),
        ("deepseek-v4.t5.sinkhorn20.strided", _dsv4(5, strided=True), DSV4_D, DSV4_ITERS, False),
    ]
    return [
        Case("hc_pre", shape, dt, build, {"dtype": dt, "hc_mult": N, "hidden": d, "sinkhorn_iters": it}, q)
        for shape, build, d, it, q in rows
    ]


def _post_cases(dt: str) -> list[Case]:
    quick = dt in ("float32", "bfloat16")
    rows = [  # (shape, builder, hidden, comb, quick)
        ("hy4.t7", draw.hc_post(7, N, HY4_D, comb=False), HY4_D, False, quick),
        ("deepseek-v4.t7.comb", draw.hc_post(7, N, DSV4_D, comb=True), DSV4_D, True, quick),
        ("deepseek-v4.t1.comb", draw.hc_post(1, N, DSV4_D, comb=True), DSV4_D, True, False),
        ("deepseek-v4.t37.comb", draw.hc_post(37, N, DSV4_D, comb=True), DSV4_D, True, False),
        ("hy4.t37", draw.hc_post(37, N, HY4_D, comb=False), HY4_D, False, False),
        ("deepseek-v4.t0.comb", draw.hc_post(0, N, DSV4_D, comb=True), DSV4_D, True, False),
        ("hy4.t0", draw.hc_post(0, N, HY4_D, comb=False), HY4_D, False, False),
        ("d200.t9.comb", draw.hc_post(9, N, 200, comb=True), 200, True, quick),
        ("d64.t9", draw.hc_post(9, N, 64, comb=False), 64, False, False),
        ("hy4.t5.magnitude256", draw.hc_post(5, N, HY4_D, comb=False, magnitude=256.0), HY4_D, False, False),
        ("deepseek-v4.t5.comb.strided", draw.hc_post(5, N, DSV4_D, comb=True, strided=True), DSV4_D, True, False),
    ]
    return [
        Case("hc_post", shape, dt, build, {"dtype": dt, "hc_mult": N, "hidden": d, "comb": c}, q)
        for shape, build, d, c, q in rows
    ]


def _head_cases(dt: str) -> list[Case]:
    quick = dt in ("float32", "bfloat16")
    rows = [  # (shape, builder, hidden, quick)
        ("hy4.t7", draw.hc_head(7, N, HY4_D, norm_eps=HY4_NORM_EPS, hc_eps=HC_EPS), HY4_D, quick),
        ("deepseek-v4.t7", draw.hc_head(7, N, DSV4_D, norm_eps=DSV4_NORM_EPS, hc_eps=HC_EPS), DSV4_D, quick),
        ("deepseek-v4.t1", draw.hc_head(1, N, DSV4_D, norm_eps=DSV4_NORM_EPS, hc_eps=HC_EPS), DSV4_D, False),
        ("deepseek-v4.t37", draw.hc_head(37, N, DSV4_D, norm_eps=DSV4_NORM_EPS, hc_eps=HC_EPS), DSV4_D, False),
        ("hy4.t0", draw.hc_head(0, N, HY4_D, norm_eps=HY4_NORM_EPS, hc_eps=HC_EPS), HY4_D, False),
        ("d200.t9.eps0.05", draw.hc_head(9, N, 200, hc_eps=0.05), 200, quick),
        ("d64.t5.magnitude256", draw.hc_head(5, N, 64, magnitude=256.0), 64, False),
    ]
    return [
        Case("hc_head", shape, dt, build, {"dtype": dt, "hc_mult": N, "hidden": d}, q) for shape, build, d, q in rows
    ]


def cases() -> list[Case]:
    out: list[Case] = []
    for dt in FLOATS:
        out += _pre_cases(dt) + _post_cases(dt) + _head_cases(dt)
    return out
