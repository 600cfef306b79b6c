"""Inputs of the attention cases (write_kv, paged_attention, varlen_attention, merge_attention),
and their static options."""

from __future__ import annotations

from typing import Any

import torch

from hetero.verify.inputs.draw import randn, uniform
from hetero.verify.inputs.paged import Heads, Seqs, blocks, meta, slots
from hetero.verify.shapes import MODELS

__all__ = ["merge", "paged", "static_paged", "varlen", "write_kv"]

# ----------------------------------------------------------------------------- builders


def _paged_tensors(
    gen: torch.Generator, h: Heads, nb: int, bs: int, t: int, dtype: torch.dtype, q_mag: float, views: bool
):
    """(query, k_cache, v_cache). ``views``: query is a slice of a packed qkv tensor and the caches
    are the K and V halves of one [NB, 2, BS, Hkv, D] tensor (FlashInfer's layout)."""
    if views:
        qkv = randn(gen, (t, (h.hq + 2 * h.hkv) * h.d), dtype)
        qkv[:, : h.hq * h.d] *= q_mag
        query = qkv[:, : h.hq * h.d].unflatten(1, (h.hq, h.d))
        kv = randn(gen, (nb, 2, bs, h.hkv, h.d), dtype)
        return query, kv[:, 0], kv[:, 1]
    query = randn(gen, (t, h.hq, h.d), dtype, q_mag)
    return query, randn(gen, (nb, bs, h.hkv, h.d), dtype), randn(gen, (nb, bs, h.hkv, h.d), dtype)


def paged(
    h: Heads,
    bs: int,
    seqs: Seqs,
    *,
    causal: bool = True,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: bool | tuple[float, float] = False,
    lse: bool = False,
    q_mag: float = 1.0,
    views: bool = False,
    alloc_out: bool = False,
):
    """paged_attention over random caches (``views``: see ``_paged_tensors``; ``sinks``: True or
    their (lo, hi) range)."""

    def build(gen: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        nb, table = blocks(gen, [L for _, L in seqs], bs)
        t = sum(n for n, _ in seqs)
        query, k_cache, v_cache = _paged_tensors(gen, h, nb, bs, t, dtype, q_mag, views)
        args: dict[str, Any] = {
            "query": query,
            "k_cache": k_cache,
            "v_cache": v_cache,
            "meta": meta(seqs, table),
            "scale": h.d**-0.5,
            "causal": causal,
            "window": window,
            "softcap": softcap,
            "return_lse": lse,
        }
        if sinks:  # default: around the lse of ~100 keys, so the sink takes a real share of the softmax
            args["sinks"] = uniform(gen, (h.hq,), *(sinks if isinstance(sinks, tuple) else (-1.0, 6.0)))
        if alloc_out:
            args["out"] = None
        return args

    return build


def _varlen_tensors(
    gen: torch.Generator, h: Heads, tq: int, tk: int, dv: int, dtype: torch.dtype, q_mag: float, view: str
):
    """(query, key, value). ``view``: "qkv" (slices of one packed projection; needs tq == tk) or
    "mla" (value the second half of [Tk, H, qk_nope + Dv], as MLA prefill splits kv_b_proj)."""
    if view == "qkv":
        assert tq == tk and dv == h.d
        qkv = randn(gen, (tq, h.hq + 2 * h.hkv, h.d), dtype)
        qkv[:, : h.hq] *= q_mag
        return qkv.split([h.hq, h.hkv, h.hkv], dim=1)
    query = randn(gen, (tq, h.hq, h.d), dtype, q_mag)
    key = randn(gen, (tk, h.hkv, h.d), dtype)
    if view == "mla":  # kv_b_proj's output [Tk, H, qk_nope + Dv] split into k_nope and v
        nope = h.d - MODELS["deepseek-v3"].qk_rope_head_dim
        return query, key, randn(gen, (tk, h.hkv, nope + dv), dtype)[..., nope:]
    return query, key, randn(gen, (tk, h.hkv, dv), dtype)


def _cu_seqlens(lens: list[int]) -> torch.Tensor:
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32)


def varlen(
    h: Heads,
    seqs: Seqs,
    *,
    dv: int | None = None,
    causal: bool = True,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    lse: bool = False,
    q_mag: float = 1.0,
    view: str = "",
    scale: float | None = None,
):
    """varlen_attention (``view``: see ``_varlen_tensors``). ``scale`` defaults to D ** -0.5 (MLA
    prefill passes DeepSeek's, with the yarn mscale)."""
    dv = dv or h.d

    def build(gen: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        qs, ks = [n for n, _ in seqs], [L for _, L in seqs]
        query, key, value = _varlen_tensors(gen, h, sum(qs), sum(ks), dv, dtype, q_mag, view)
        return {
            "query": query,
            "key": key,
            "value": value,
            "cu_seqlens_q": _cu_seqlens(qs),
            "cu_seqlens_k": _cu_seqlens(ks),
            "max_seqlen_q": max(qs, default=0),
            "max_seqlen_k": max(ks, default=0),
            "scale": h.d**-0.5 if scale is None else scale,
            "causal": causal,
            "window": window,
            "softcap": softcap,
            "return_lse": lse,
        }

    return build


def write_kv(h: Heads, bs: int, seqs: Seqs, skipped: int, views: bool = False):
    """write_kv of one step's tokens into random caches. ``views``: key and value are slices of a
    packed qkv tensor and the caches the halves of one [NB, 2, BS, Hkv, D] tensor."""

    def build(gen: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        nb, slot_mapping = slots(gen, seqs, bs, skipped)
        t = slot_mapping.shape[0]
        if views:
            qkv = randn(gen, (t, h.hq + 2 * h.hkv, h.d), dtype)
            _, key, value = qkv.split([h.hq, h.hkv, h.hkv], dim=1)
            kv = randn(gen, (nb, 2, bs, h.hkv, h.d), dtype)
            k_cache, v_cache = kv[:, 0], kv[:, 1]
        else:
            key, value = randn(gen, (t, h.hkv, h.d), dtype), randn(gen, (t, h.hkv, h.d), dtype)
            k_cache, v_cache = randn(gen, (nb, bs, h.hkv, h.d), dtype), randn(gen, (nb, bs, h.hkv, h.d), dtype)
        return {"key": key, "value": value, "k_cache": k_cache, "v_cache": v_cache, "slot_mapping": slot_mapping}

    return build


def merge(t: int, h: int, dv: int, *, lo: float = -2.0, hi: float = 12.0, lse_view: bool = False):
    """merge_attention of two partials: random outputs, lse in [lo, hi]; about 15% of the (token,
    head) rows are -inf on side a only, 15% on b only, 10% on both, and the last token is empty on
    both sides (a padding token). Outputs of empty rows stay random: they must carry no weight.
    ``lse_view``: the lse are [H, T] tensors transposed, as flash-attn returns them."""

    def build(gen: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        out_a, out_b = randn(gen, (t, h, dv), dtype), randn(gen, (t, h, dv), dtype)
        lse_a, lse_b = uniform(gen, (h, t), lo, hi), uniform(gen, (h, t), lo, hi)
        u = uniform(gen, (h, t), 0.0, 1.0)
        inf = float("-inf")
        lse_a = lse_a.masked_fill((u < 0.15) | (u >= 0.9), inf)
        lse_b = lse_b.masked_fill(((u >= 0.15) & (u < 0.3)) | (u >= 0.9), inf)
        if t:
            lse_a[:, -1] = lse_b[:, -1] = inf
        lse_a, lse_b = lse_a.t(), lse_b.t()
        if not lse_view:
            lse_a, lse_b = lse_a.contiguous(), lse_b.contiguous()
        return {"out_a": out_a, "lse_a": lse_a, "out_b": out_b, "lse_b": lse_b}

    return build


def static_paged(dt: str, h: Heads, bs: int, opts: dict[str, Any]) -> dict[str, Any]:
    st = {"dtype": dt, "head_dim": h.d, "head_dim_v": h.d, "block_size": bs, "num_heads": h.hq, "num_kv_heads": h.hkv}
    st.update({"causal": True, "window": opts.get("window", (-1, -1)), "softcap": opts.get("softcap", 0.0)})
    st["sinks"] = bool(opts.get("sinks"))
    return st
