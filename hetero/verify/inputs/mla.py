"""Inputs of the MLA cases (write_mla_kv, mla_attention), and their static options."""

from __future__ import annotations

from typing import Any

import torch

from hetero.verify.inputs.draw import randn
from hetero.verify.inputs.paged import Seqs, blocks, meta, mla_scale, slots
from hetero.verify.shapes import MODELS

__all__ = ["mla", "static", "write_mla_kv"]


def write_mla_kv(model: str, bs: int, seqs: Seqs, skipped: int, views: bool = False):
    """write_mla_kv. ``views``: kv_c and k_pe are the two slices of kv_a_proj's [T, Lkv + R] output."""
    m = MODELS[model]
    lkv, r = m.kv_lora_rank, m.qk_rope_head_dim

    def build(gen: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        nb, slot_mapping = slots(gen, seqs, bs, skipped)
        t = slot_mapping.shape[0]
        if views:
            kv_c, k_pe = randn(gen, (t, lkv + r), dtype).split([lkv, r], dim=1)
        else:
            kv_c, k_pe = randn(gen, (t, lkv), dtype), randn(gen, (t, r), dtype)
        return {
            "kv_c": kv_c,
            "k_pe": k_pe,
            "ckv_cache": randn(gen, (nb, bs, lkv), dtype),
            "kpe_cache": randn(gen, (nb, bs, r), dtype),
            "slot_mapping": slot_mapping,
        }

    return build


def mla(model: str, bs: int, seqs: Seqs, *, lse: bool = False, q_mag: float = 1.0, views: bool = False):
    """mla_attention. ``views``: q_nope as vLLM's absorbed bmm leaves it ([H, T, Lkv] transposed) and
    q_pe the rope slice of the [T, H, qk_nope + R] query projection."""
    m = MODELS[model]
    h, lkv, r, nope = m.heads, m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim

    def build(gen: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        nb, table = blocks(gen, [L for _, L in seqs], bs)
        t = sum(n for n, _ in seqs)
        if views:
            q_nope = randn(gen, (h, t, lkv), dtype, q_mag).transpose(0, 1)
            q_pe = randn(gen, (t, h, nope + r), dtype, q_mag)[..., nope:]
        else:
            q_nope, q_pe = randn(gen, (t, h, lkv), dtype, q_mag), randn(gen, (t, h, r), dtype, q_mag)
        return {
            "q_nope": q_nope,
            "q_pe": q_pe,
            "ckv_cache": randn(gen, (nb, bs, lkv), dtype),
            "kpe_cache": randn(gen, (nb, bs, r), dtype),
            "meta": meta(seqs, table),
            "scale": mla_scale(model),
            "causal": True,
            "return_lse": lse,
        }

    return build


def static(dt: str, model: str, bs: int, lse: bool = False) -> dict[str, Any]:
    m = MODELS[model]
    return {
        "dtype": dt,
        "head_dim": m.kv_lora_rank + m.qk_rope_head_dim,
        "head_dim_v": m.kv_lora_rank,
        "kv_lora_rank": m.kv_lora_rank,
        "qk_rope_head_dim": m.qk_rope_head_dim,
        "num_heads": m.heads,
        "block_size": bs,
        **({"return_lse": True} if lse else {}),
    }
