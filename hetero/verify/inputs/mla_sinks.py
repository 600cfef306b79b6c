"""Inputs of the cases of mla_attention's sinks (spec 1.7): Hunyuan HY4's absorbed MLA, dense and sparse.

HY4 (transformers ``models/hy_v4``, ``HYV4Attention``): 32 query heads (16 per rank under 2-way tensor
parallelism, which splits the sinks with the heads), the latent Lkv 512 and rope R 64 of DeepSeek's
MLA, qk_nope 192 so the softmax scale is ``(192 + 64) ** -0.5``, a DSA indexer keeping 2048 keys, and
one learned sink per head passed to gpt-oss's eager attention as ``s_aux``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hetero.verify.inputs.draw import randn, uniform
from hetero.verify.inputs.dsa_draw import sparse_rows
from hetero.verify.inputs.paged import Seqs, blocks, meta

__all__ = ["Hy4Mla", "HY4", "HY4_TP2", "mla_sinks", "static"]


@dataclass(frozen=True)
class Hy4Mla:
    """One rank's share of HY4's absorbed MLA: H query heads over one latent head of Lkv + R."""

    heads: int
    lkv: int = 512
    rope: int = 64
    topk: int = 2048
    scale: float = (192 + 64) ** -0.5


HY4, HY4_TP2 = Hy4Mla(32), Hy4Mla(16)


def _sinks(gen: torch.Generator, h: int, sinks: bool | float, strided: bool) -> torch.Tensor:
    """float32 [H]. True: uniform in [0, 9], around the lse of 100..2048 keys, so the sink takes a real
    share of each row's softmax; a float M: +M and -M on alternate heads (a sink that swamps every key,
    and one that is nothing). ``strided``: every other element of a [2H] tensor (a view the spec allows)."""
    n = h * (2 if strided else 1)
    if sinks is True:
        full = uniform(gen, (n,), 0.0, 9.0)
    else:
        full = float(sinks) * (1.0 - 2.0 * (torch.arange(n) % 2)).to(torch.float32)
    return full[::2] if strided else full


def mla_sinks(
    m: Hy4Mla,
    bs: int,
    seqs: Seqs,
    *,
    sinks: bool | float = True,
    k: int = 0,
    empty: int = 0,
    beyond: int = 0,
    lse: bool = True,
    strided: bool = False,
):
    """mla_attention with sinks: dense (``k`` 0) or sparse over top-k rows as indexer_topk returns them
    (``k`` entries, ``beyond``/``empty`` as in ``dsa_draw.sparse_rows``: ``empty`` rows see no key)."""

    def build(gen: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        nb, table = blocks(gen, [L for _, L in seqs], bs)
        t = sum(n for n, _ in seqs)
        args: dict[str, Any] = {
            "q_nope": randn(gen, (t, m.heads, m.lkv), dtype),
            "q_pe": randn(gen, (t, m.heads, m.rope), dtype),
            "ckv_cache": randn(gen, (nb, bs, m.lkv), dtype),
            "kpe_cache": randn(gen, (nb, bs, m.rope), dtype),
            "meta": meta(seqs, table),
            "scale": m.scale,
            "causal": True,
            "return_lse": lse,
            "sinks": _sinks(gen, m.heads, sinks, strided),
        }
        if k:
            args["topk_indices"] = sparse_rows(gen, seqs, k, beyond=beyond, empty=empty)
        return args

    return build


def static(dt: str, m: Hy4Mla, bs: int, *, k: int = 0, lse: bool = True) -> dict[str, Any]:
    return {
        "dtype": dt,
        "head_dim": m.lkv + m.rope,
        "head_dim_v": m.lkv,
        "kv_lora_rank": m.lkv,
        "qk_rope_head_dim": m.rope,
        "num_heads": m.heads,
        "block_size": bs,
        "sinks": True,
        **({"topk_indices": True, "topk": k} if k else {}),
        **({"return_lse": True} if lse else {}),
    }
