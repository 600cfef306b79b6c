"""Argument checks of the DSA ops of spec 1.3 (``write_index_k``, ``indexer_topk``,
``mla_attention(topk_indices=...)``) and of ``layer_norm``, split from ``hetero.spec.checks``,
which they build on. Every failure is an OpError naming the op, the argument, what was
expected and what came.

These read host metadata only (shapes, dtypes, devices): they are the always-on checks. The
index contents (``slot_mapping``, ``meta``) are read by ``hetero.spec.validate``; the
entries of ``topk_indices`` need no check at all, as every entry outside a row's visible
positions is skipped by definition (a kernel masks it).
"""

from __future__ import annotations

import math
import numbers

import torch

from hetero.errors import OpError
from hetero.spec._checks_core import INDEX_DTYPES, check_at_least_1d, check_same_device, check_tensor, meta_tensors
from hetero.spec.attention import INDEX_SCALE_GROUP
from hetero.spec.types import FLOAT_DTYPES, AttentionMeta

__all__ = [
    "INDEX_FP8",
    "SCALE_DTYPES",
    "check_index_k_write",
    "check_indexer_inputs",
    "check_compress_ratio",
    "check_topk_indices",
    "check_layer_norm",
]

#: The dtype of an index-key cache in the fp8 format.
INDEX_FP8 = torch.float8_e4m3fn
#: index_scale and the indexer's weights are float32 by the spec; float64 is the oracle's run.
SCALE_DTYPES = (torch.float32, torch.float64)


def _check_index_cache(
    op: str, index_cache: object, index_scale: object, d: int, plain: torch.dtype
) -> tuple[int, int]:
    """index_cache [NB, BS, D] of ``plain`` dtype, or float8_e4m3fn with index_scale float32
    [NB, BS, D // 128] (D a multiple of 128). Returns (NB, BS)."""
    if index_scale is None:
        if not (not isinstance(index_cache, torch.Tensor) or index_cache.dtype != INDEX_FP8):
            raise OpError(
                op, "index_scale", "a float32 [NB, BS, D // 128] tensor with a float8_e4m3fn index_cache", "None"
            )
        cache = check_tensor(op, "index_cache", index_cache, shape=(None, None, d), dtypes=(plain,))
    else:
        cache = check_tensor(op, "index_cache", index_cache, shape=(None, None, d), dtypes=(INDEX_FP8,))
        if not (d % INDEX_SCALE_GROUP == 0):
            raise OpError(
                op,
                "index_cache",
                f"a key dim that is a multiple of {INDEX_SCALE_GROUP} in the fp8 format",
                f"shape {list(cache.shape)}",
            )
        nb, bs = cache.shape[:2]
        check_tensor(op, "index_scale", index_scale, shape=(nb, bs, d // INDEX_SCALE_GROUP), dtypes=SCALE_DTYPES)
    if not (cache.shape[1] >= 1):
        raise OpError(op, "index_cache", "a block size >= 1", f"shape {list(cache.shape)}")
    return cache.shape[0], cache.shape[1]


def check_index_k_write(
    op: str, k: object, index_cache: object, slot_mapping: object, index_scale: object = None
) -> tuple[int, int]:
    """The tensors of write_index_k: k [T, D] float; index_cache [NB, BS, D] of k's dtype, or
    float8_e4m3fn with index_scale float32 [NB, BS, D // 128]; slot_mapping int64 [T] (its
    values are the caller's: ``check_slot_mapping``). Returns (T, NB * BS)."""
    check_tensor(op, "k", k, ndim=2, dtypes=FLOAT_DTYPES)
    assert isinstance(k, torch.Tensor)
    t, d = k.shape
    nb, bs = _check_index_cache(op, index_cache, index_scale, d, k.dtype)
    check_tensor(op, "slot_mapping", slot_mapping, shape=(t,), dtypes=(torch.int64,))
    check_same_device(op, k=k, index_cache=index_cache, slot_mapping=slot_mapping, index_scale=index_scale)
    return t, nb * bs


def check_compress_ratio(op: str, compress_ratio: object) -> int:
    """indexer_topk's compress_ratio (spec 1.8): an int >= 1."""
    ok = isinstance(compress_ratio, numbers.Integral) and not isinstance(compress_ratio, bool) and compress_ratio >= 1
    if not ok:
        raise OpError(op, "compress_ratio", "an int >= 1", repr(compress_ratio))
    return int(compress_ratio)  # type: ignore[arg-type]


def check_indexer_inputs(
    op: str,
    q: object,
    weights: object,
    index_cache: object,
    meta: object,
    topk: object,
    index_scale: object = None,
    compress_ratio: object = 1,
) -> tuple[int, int, int, int, int, int]:
    """The arguments of indexer_topk but the metadata's values (``check_meta`` reads those):
    q [T, Hi, D] float; weights float32 [T, Hi]; index_cache [NB, BS, D] of q's dtype or the fp8
    format with its index_scale; meta an AttentionMeta; topk an int >= 1; compress_ratio an int
    >= 1; one device. Returns (T, Hi, D, NB, BS, topk)."""
    check_tensor(op, "q", q, ndim=3, dtypes=FLOAT_DTYPES)
    assert isinstance(q, torch.Tensor)
    t, hi, d = q.shape
    check_tensor(op, "weights", weights, shape=(t, hi), dtypes=SCALE_DTYPES)
    nb, bs = _check_index_cache(op, index_cache, index_scale, d, q.dtype)
    if not isinstance(meta, AttentionMeta):
        raise OpError(op, "meta", "an AttentionMeta", type(meta).__name__)
    ok = isinstance(topk, numbers.Integral) and not isinstance(topk, bool) and topk >= 1
    if not ok:
        raise OpError(op, "topk", "an int >= 1", repr(topk))
    check_compress_ratio(op, compress_ratio)
    check_same_device(op, q=q, weights=weights, index_cache=index_cache, index_scale=index_scale, **meta_tensors(meta))
    return t, hi, d, nb, bs, int(topk)  # type: ignore[arg-type]


def check_topk_indices(op: str, topk_indices: object, tokens: int, device: torch.device) -> int:
    """mla_attention's topk_indices: int32 or int64 [T, K] with K >= 1, on the query's device.
    Its entries are not read (any entry outside a row's visible positions is skipped). Returns K."""
    check_tensor(op, "topk_indices", topk_indices, ndim=2, dtypes=INDEX_DTYPES)
    assert isinstance(topk_indices, torch.Tensor)
    shape = list(topk_indices.shape)
    if not (shape[0] == tokens):
        raise OpError(op, "topk_indices", f"{tokens} rows (one per query token)", f"shape {shape}")
    if not (shape[1] >= 1):
        raise OpError(op, "topk_indices", "at least one column (K >= 1)", f"shape {shape}")
    if not (topk_indices.device == device):
        raise OpError(op, "topk_indices", f"device {device} (that of 'q_nope')", str(topk_indices.device))
    return shape[1]


def check_layer_norm(op: str, x: object, weight: object, bias: object, eps: object) -> int:
    """x [..., H] float; weight [H] and bias [H] (or None) of x's dtype or float32; eps a
    positive finite number; one device. Returns H."""
    x = check_at_least_1d(op, "x", x, FLOAT_DTYPES)
    hidden = x.shape[-1]
    dtypes = tuple(dict.fromkeys((x.dtype, torch.float32)))
    check_tensor(op, "weight", weight, shape=(hidden,), dtypes=dtypes)
    if bias is not None:
        check_tensor(op, "bias", bias, shape=(hidden,), dtypes=dtypes)
    ok = isinstance(eps, numbers.Real) and not isinstance(eps, bool) and math.isfinite(eps) and eps > 0
    if not ok:
        raise OpError(op, "eps", "a positive finite number", repr(eps))
    check_same_device(op, x=x, weight=weight, bias=bias)
    return hidden
