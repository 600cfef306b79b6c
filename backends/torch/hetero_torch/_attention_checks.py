"""Argument validation of the torch backend's attention ops (every failure is an OpError).

Each helper returns the sizes or host values the op goes on with, so an op never indexes
with an unchecked value: the metadata's values are read on the host (``check_meta``) before
any gather, which keeps every index in range on every device.
"""
from __future__ import annotations

import math
import numbers

import torch

from hetero.spec.checks import check_tensor, expect
from hetero.spec.types import FLOAT_DTYPES

__all__ = ["STAT_DTYPES", "check_options", "check_paged_cache", "check_gqa", "check_sinks", "check_out", "check_max_len"]

#: lse and sinks are float32 by the spec; float64 is accepted for the float64 oracle run.
STAT_DTYPES = (torch.float32, torch.float64)


def _is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _is_int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def check_options(
    op: str, scale: object, causal: object, window: object, softcap: object, return_lse: object
) -> tuple[float, tuple[int, int], float]:
    """scale a finite float, window a pair of ints >= -1, softcap a finite float >= 0, flags bools."""
    expect(_is_real(scale) and math.isfinite(scale), op, "scale", "a finite float", repr(scale))
    expect(isinstance(causal, bool), op, "causal", "a bool", repr(causal))
    expect(isinstance(return_lse, bool), op, "return_lse", "a bool", repr(return_lse))
    pair = isinstance(window, (tuple, list)) and len(window) == 2
    expect(pair and all(_is_int(w) for w in window), op, "window", "a pair of ints (left, right)", repr(window))
    expect(min(window) >= -1, op, "window", "sizes >= 0, or -1 for unbounded", repr(window))
    ok = _is_real(softcap) and math.isfinite(softcap) and softcap >= 0
    expect(ok, op, "softcap", "a finite float >= 0 (0 disables)", repr(softcap))
    return float(scale), (int(window[0]), int(window[1])), float(softcap)


def check_gqa(op: str, arg: str, hq: int, hkv: int) -> None:
    expect(hkv >= 1, op, arg, "at least one KV head", hkv)
    expect(hq % hkv == 0, op, arg, f"a KV head count dividing the query head count {hq}", f"{hkv} KV heads")


def check_paged_cache(op: str, query: object, k_cache: object, v_cache: object) -> tuple[int, int]:
    """query [T, Hq, D]; k_cache [NB, BS, Hkv, D] and v_cache [NB, BS, Hkv, Dv] of its dtype; returns (NB, BS)."""
    q = check_tensor(op, "query", query, ndim=3, dtypes=FLOAT_DTYPES)
    hq, d = q.shape[1], q.shape[2]
    dt = (q.dtype,)
    k = check_tensor(op, "k_cache", k_cache, ndim=4, dtypes=dt)
    nb, bs, hkv = k.shape[0], k.shape[1], k.shape[2]
    expect(k.shape[3] == d, op, "k_cache", f"head dim {d} (that of 'query')", f"shape {list(k.shape)}")
    check_tensor(op, "v_cache", v_cache, shape=(nb, bs, hkv, None), dtypes=dt)
    expect(bs >= 1, op, "k_cache", "a block size >= 1", f"shape {list(k.shape)}")
    check_gqa(op, "k_cache", hq, hkv)
    return nb, bs


def check_sinks(op: str, sinks: object, hq: int) -> None:
    if sinks is not None:
        check_tensor(op, "sinks", sinks, shape=(hq,), dtypes=STAT_DTYPES)


def check_out(op: str, out: object, shape: tuple[int, ...], like: torch.Tensor) -> None:
    """out, when given, must be [shape] of like's dtype on like's device."""
    if out is None:
        return
    res = check_tensor(op, "out", out, shape=shape, dtypes=(like.dtype,))
    expect(res.device == like.device, op, "out", f"device {like.device} (that of 'query')", res.device)


def check_max_len(op: str, arg: str, value: object, cu: list[int]) -> None:
    """A host int bounding every length of the cumulative list cu."""
    longest = max((cu[b + 1] - cu[b] for b in range(len(cu) - 1)), default=0)
    expect(_is_int(value) and value >= 0, op, arg, "an int >= 0", repr(value))
    expect(value >= longest, op, arg, f"at least the longest sequence ({longest})", value)
