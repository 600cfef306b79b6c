"""Argument validation of the attention ops, shared by the backends that check in Python (every failure is an OpError).

Each helper returns the sizes or host values the op goes on with, so the op
itself never indexes with an unchecked value.
"""

from __future__ import annotations

import math
import numbers

import torch

from hetero.errors import OpError
from hetero.spec._checks_core import (
    check_cu_seqlens,
    check_mla_inputs,
    check_same_device,
    check_slot_mapping,
    check_tensor,
    meta_tensors,
)
from hetero.spec._checks_dsa import check_topk_indices
from hetero.spec._checks_meta import check_meta
from hetero.spec.types import FLOAT_DTYPES, AttentionMeta

__all__ = [
    "STAT_DTYPES",
    "check_options",
    "check_int",
    "check_flag",
    "check_max_len",
    "check_paged_cache",
    "check_gqa",
    "check_sinks",
    "check_out",
    "check_varlen",
    "check_mla_kv_write",
    "check_mla",
]

#: lse and sinks are float32 by the spec; float64 is accepted for the float64 oracle run.
STAT_DTYPES = (torch.float32, torch.float64)


def _is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _is_int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def check_flag(op: str, arg: str, x: object) -> bool:
    if not isinstance(x, bool):
        raise OpError(op, arg, "a bool", repr(x))
    return bool(x)


def check_int(op: str, arg: str, x: object, minimum: int) -> int:
    if not (_is_int(x) and x >= minimum):
        raise OpError(op, arg, f"an int >= {minimum}", repr(x))
    return int(x)


def check_options(
    op: str, scale: object, causal: object, window: object, softcap: object, return_lse: object
) -> tuple[float, tuple[int, int], float]:
    """scale a finite float, window a pair of ints >= -1, softcap a finite float >= 0, flags bools."""
    if not (_is_real(scale) and math.isfinite(scale)):
        raise OpError(op, "scale", "a finite float", repr(scale))
    check_flag(op, "causal", causal)
    check_flag(op, "return_lse", return_lse)
    pair = isinstance(window, (tuple, list)) and len(window) == 2
    if not (pair and all(_is_int(w) for w in window)):
        raise OpError(op, "window", "a pair of ints (left, right)", repr(window))
    if not (min(window) >= -1):
        raise OpError(op, "window", "sizes >= 0, or -1 for unbounded", repr(window))
    if not (_is_real(softcap) and math.isfinite(softcap) and softcap >= 0):
        raise OpError(op, "softcap", "a finite float >= 0 (0 disables)", repr(softcap))
    return float(scale), (int(window[0]), int(window[1])), float(softcap)


def check_gqa(op: str, arg: str, hq: int, hkv: int) -> None:
    if not (hkv >= 1):
        raise OpError(op, arg, "at least one KV head", str(hkv))
    if not (hq % hkv == 0):
        raise OpError(op, arg, f"a KV head count dividing the query head count {hq}", f"{hkv} KV heads")


def check_paged_cache(op: str, query: torch.Tensor, k_cache: object, v_cache: object) -> tuple[int, int]:
    """k_cache [NB, BS, Hkv, D] and v_cache [NB, BS, Hkv, Dv] of the query's dtype; returns (NB, BS)."""
    check_tensor(op, "query", query, ndim=3, dtypes=FLOAT_DTYPES)
    hq, d = query.shape[1], query.shape[2]
    dt = (query.dtype,)
    k = check_tensor(op, "k_cache", k_cache, ndim=4, dtypes=dt)
    nb, bs, hkv = k.shape[0], k.shape[1], k.shape[2]
    if not (k.shape[3] == d):
        raise OpError(op, "k_cache", f"head dim {d} (that of 'query')", f"shape {list(k.shape)}")
    check_tensor(op, "v_cache", v_cache, shape=(nb, bs, hkv, None), dtypes=dt)
    if not (bs >= 1):
        raise OpError(op, "k_cache", "a block size >= 1", f"shape {list(k.shape)}")
    check_gqa(op, "k_cache", hq, hkv)
    return nb, bs


def check_sinks(op: str, sinks: torch.Tensor | None, hq: int) -> None:
    if sinks is not None:
        check_tensor(op, "sinks", sinks, shape=(hq,), dtypes=STAT_DTYPES)


def check_out(op: str, out: torch.Tensor | None, shape: tuple[int, ...], like: torch.Tensor) -> None:
    """out, when given, must be [shape] of like's dtype on like's device."""
    if out is None:
        return
    check_tensor(op, "out", out, shape=shape, dtypes=(like.dtype,))
    if not (out.device == like.device):
        raise OpError(op, "out", f"device {like.device} (that of 'query')", str(out.device))


def check_max_len(op: str, arg: str, value: object, cu: list[int]) -> None:
    """A host int bounding every length of the cumulative list cu."""
    longest = max((cu[b + 1] - cu[b] for b in range(len(cu) - 1)), default=0)
    check_int(op, arg, value, 0)
    if not (value >= longest):
        raise OpError(op, arg, f"at least the longest sequence ({longest})", str(value))


def check_varlen(
    op: str,
    query: object,
    key: object,
    value: object,
    cu_seqlens_q: object,
    cu_seqlens_k: object,
    max_seqlen_q: object,
    max_seqlen_k: object,
) -> tuple[list[int], list[int]]:
    """query [Tq, Hq, D], key [Tk, Hkv, D], value [Tk, Hkv, Dv] of one dtype, GQA heads, one device, and the
    cumulative lengths with their maxima; returns the host cumulative lengths (cu_q, cu_k)."""
    check_tensor(op, "query", query, ndim=3, dtypes=FLOAT_DTYPES)
    (tq, hq, d), dt = query.shape, (query.dtype,)
    check_tensor(op, "key", key, shape=(None, None, d), dtypes=dt)
    tk, hkv = key.shape[:2]
    check_tensor(op, "value", value, shape=(tk, hkv, None), dtypes=dt)
    check_gqa(op, "key", hq, hkv)
    check_same_device(op, query=query, key=key, value=value, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    cq = check_cu_seqlens(op, "cu_seqlens_q", cu_seqlens_q, tq)
    ck = check_cu_seqlens(op, "cu_seqlens_k", cu_seqlens_k, tk, len(cq) - 1)
    check_max_len(op, "max_seqlen_q", max_seqlen_q, cq)
    check_max_len(op, "max_seqlen_k", max_seqlen_k, ck)
    return cq, ck


def check_mla_kv_write(
    op: str, kv_c: object, k_pe: object, ckv_cache: object, kpe_cache: object, slot_mapping: object
) -> None:
    """kv_c [T, Lkv] and k_pe [T, R] into ckv_cache [NB, BS, Lkv] and kpe_cache [NB, BS, R] of one dtype and
    device, through slot_mapping (its values checked against NB * BS)."""
    check_tensor(op, "kv_c", kv_c, ndim=2, dtypes=FLOAT_DTYPES)
    t, lkv = kv_c.shape
    dt = (kv_c.dtype,)
    check_tensor(op, "k_pe", k_pe, shape=(t, None), dtypes=dt)
    check_tensor(op, "ckv_cache", ckv_cache, shape=(None, None, lkv), dtypes=dt)
    nb, bs = ckv_cache.shape[:2]
    check_tensor(op, "kpe_cache", kpe_cache, shape=(nb, bs, k_pe.shape[1]), dtypes=dt)
    check_same_device(op, kv_c=kv_c, k_pe=k_pe, ckv_cache=ckv_cache, kpe_cache=kpe_cache, slot_mapping=slot_mapping)
    check_slot_mapping(op, slot_mapping, t, nb * bs)


def check_mla(
    op: str,
    q_nope: object,
    q_pe: object,
    ckv_cache: object,
    kpe_cache: object,
    meta: AttentionMeta,
    topk_indices: object,
) -> tuple[int, int, int, int, list[int], list[int]]:
    """mla_attention's tensors, metadata (read on the host) and optional topk_indices; returns
    (T, H, Lkv, BS, query_start_loc, seq_lens)."""
    t, h, lkv, nb, bs = check_mla_inputs(op, q_nope, q_pe, ckv_cache, kpe_cache, FLOAT_DTYPES)
    check_same_device(op, q_nope=q_nope, q_pe=q_pe, ckv_cache=ckv_cache, kpe_cache=kpe_cache, **meta_tensors(meta))
    if topk_indices is not None:
        check_topk_indices(op, topk_indices, t, q_nope.device)
    qsl, seq_lens = check_meta(op, meta, t, nb, bs)
    return t, h, lkv, bs, qsl, seq_lens
