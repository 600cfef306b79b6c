"""The checks of the hyper-connection ops hc_pre, hc_post and hc_head (spec 1.7), for
``hetero.spec.checks`` (import them from there): each failure is an OpError naming the op, the
argument, what was expected and what came. They read host metadata only (types, shapes, dtypes,
devices): nothing of these ops indexes memory by a tensor's values.
"""

from __future__ import annotations

import math
import numbers

import torch

from hetero.errors import OpError
from hetero.spec._checks_core import check_same_device, check_tensor
from hetero.spec.types import FLOAT_DTYPES

__all__ = ["HC_PARAM_DTYPES", "hc_rows", "check_hc_pre", "check_hc_post", "check_hc_head"]

#: The mixing parameters and the weights post/comb are float32 by the spec; float64 is the oracle's run.
HC_PARAM_DTYPES = (torch.float32, torch.float64)


def hc_rows(streams: int, sinkhorn_iters: int) -> tuple[int, int]:
    """(M, S): the rows of ``fn``/``base`` and the entries of ``scale`` of hc_pre for N streams."""
    return (streams * (streams + 2), 3) if sinkhorn_iters else (2 * streams, 2)


def _real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _streams(op: str, streams: object) -> tuple[int, int, int]:
    s = check_tensor(op, "streams", streams, ndim=3, dtypes=FLOAT_DTYPES)
    tokens, n, d = s.shape
    if not (n >= 1 and d >= 1):
        raise OpError(op, "streams", "[T, N, D] with N >= 1 streams and D >= 1", f"shape {list(s.shape)}")
    return tokens, n, d


def _mixing(op: str, streams: torch.Tensor, fn: object, scale: object, base: object, rows: int, entries: int, why: str):
    _, n, d = streams.shape
    check_tensor(op, "fn", fn, ndim=2, dtypes=HC_PARAM_DTYPES)
    assert isinstance(fn, torch.Tensor)
    if tuple(fn.shape) != (rows, n * d):
        raise OpError(op, "fn", f"shape [{rows}, {n * d}] ({why}, N*D columns)", f"shape {list(fn.shape)}")
    check_tensor(op, "base", base, ndim=1, dtypes=HC_PARAM_DTYPES)
    assert isinstance(base, torch.Tensor)
    if base.shape[0] != rows:
        raise OpError(op, "base", f"shape [{rows}] (that of fn's rows)", f"shape {list(base.shape)}")
    check_tensor(op, "scale", scale, ndim=1, dtypes=HC_PARAM_DTYPES)
    assert isinstance(scale, torch.Tensor)
    if scale.shape[0] != entries:
        raise OpError(op, "scale", f"shape [{entries}] ({why})", f"shape {list(scale.shape)}")
    check_same_device(op, streams=streams, fn=fn, scale=scale, base=base)


def _eps(op: str, norm_eps: object, hc_eps: object) -> None:
    if not (_real(norm_eps) and norm_eps > 0):  # type: ignore[operator]
        raise OpError(op, "norm_eps", "a positive finite number", repr(norm_eps))
    if not (_real(hc_eps) and hc_eps >= 0):  # type: ignore[operator]
        raise OpError(op, "hc_eps", "a finite number >= 0", repr(hc_eps))


def check_hc_pre(
    op: str,
    streams: object,
    fn: object,
    scale: object,
    base: object,
    norm_eps: object,
    hc_eps: object,
    post_mult: object,
    post_eps: object,
    sinkhorn_iters: object,
) -> tuple[int, int, int]:
    """The arguments of hc_pre; returns (T, N, D)."""
    tokens, n, d = _streams(op, streams)
    if not (type(sinkhorn_iters) is int and sinkhorn_iters >= 0):
        raise OpError(op, "sinkhorn_iters", "an int >= 0 (0: no Sinkhorn, no comb)", repr(sinkhorn_iters))
    rows, entries = hc_rows(n, sinkhorn_iters)
    why = f"N*(N+2) with Sinkhorn, N = {n}" if sinkhorn_iters else f"2N without Sinkhorn, N = {n}"
    assert isinstance(streams, torch.Tensor)
    _mixing(op, streams, fn, scale, base, rows, entries, why)
    _eps(op, norm_eps, hc_eps)
    for name, value in (("post_mult", post_mult), ("post_eps", post_eps)):
        if not _real(value):
            raise OpError(op, name, "a finite number", repr(value))
    return tokens, n, d


def check_hc_head(
    op: str, streams: object, fn: object, scale: object, base: object, norm_eps: object, hc_eps: object
) -> tuple[int, int, int]:
    """The arguments of hc_head; returns (T, N, D)."""
    tokens, n, d = _streams(op, streams)
    assert isinstance(streams, torch.Tensor)
    _mixing(op, streams, fn, scale, base, n, 1, f"N = {n} rows, one scale")
    _eps(op, norm_eps, hc_eps)
    return tokens, n, d


def check_hc_post(op: str, y: object, streams: object, post: object, comb: object) -> tuple[int, int, int]:
    """The arguments of hc_post; returns (T, N, D)."""
    tokens, n, d = _streams(op, streams)
    assert isinstance(streams, torch.Tensor)
    check_tensor(op, "y", y, shape=(tokens, d), dtypes=(streams.dtype,))
    check_tensor(op, "post", post, shape=(tokens, n), dtypes=HC_PARAM_DTYPES)
    if comb is not None:
        check_tensor(op, "comb", comb, shape=(tokens, n, n), dtypes=HC_PARAM_DTYPES)
    check_same_device(op, streams=streams, y=y, post=post, comb=comb)
    return tokens, n, d
