"""mla_attention, dense or sparse (DSA), batched with torch ops: absorbed MLA over the paged latent
cache, one latent KV head shared by every query head.

Logits are ``q_nope . ckv + q_pe . kpe``, so the query is ``[q_nope, q_pe]`` against keys
``[ckv, kpe]`` and the values are ``ckv``: the padded batch and masked softmax of
``_attention_core`` with Hkv = 1. Sparse mode swaps the causal mask for the positions each row's
``topk_indices`` lists (``_attention_core.listed``). Sinks (spec 1.7) join the masked softmax's
denominator, as paged attention's do (SDPA, which has none, serves only calls without sinks or
lse). Semantics: ``hetero.spec.attention``.
"""

from __future__ import annotations

import torch

from hetero.spec import FLOAT_DTYPES
from hetero.spec.checks import (
    check_meta,
    check_mla_inputs,
    check_options,
    check_same_device,
    check_sinks,
    check_topk_indices,
    meta_tensors,
)
from hetero.spec.types import AttentionMeta
from hetero_torch import _step_plan
from hetero_torch._attention_core import compute, listed, run, visible
from hetero_torch._attention_plan import Batch, gather_paged, pad, plan

__all__ = ["mla_attention"]


def mla_attention(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    ckv_cache: torch.Tensor,
    kpe_cache: torch.Tensor,
    meta: AttentionMeta,
    *,
    scale: float,
    causal: bool = True,
    return_lse: bool = False,
    topk_indices: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    op = "mla_attention"
    scale, window, _ = check_options(op, scale, causal, (-1, -1), 0.0, return_lse)
    t, h, lkv, nb, bs = check_mla_inputs(op, q_nope, q_pe, ckv_cache, kpe_cache, FLOAT_DTYPES)
    check_sinks(op, sinks, h)
    check_same_device(
        op, q_nope=q_nope, q_pe=q_pe, ckv_cache=ckv_cache, kpe_cache=kpe_cache, sinks=sinks, **meta_tensors(meta)
    )
    if topk_indices is not None:
        check_topk_indices(op, topk_indices, t, q_nope.device)
    planned = _step_plan.attention(meta, t, nb, bs)
    if planned is None:
        groups = plan(*check_meta(op, meta, t, nb, bs), h, q_nope.device)
    else:
        groups = planned.groups(h, q_nope.device)
    res = q_nope.new_empty(t, h, lkv)
    query = torch.cat([q_nope, q_pe], dim=-1)

    def step(batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None]:
        ckv = gather_paged(ckv_cache, meta.block_table, batch)[:, :, None]  # [Bg, L, 1, Lkv]: one latent KV head
        kpe = gather_paged(kpe_cache, meta.block_table, batch)[:, :, None]
        mask = visible(batch, causal, window) if topk_indices is None else listed(topk_indices, batch, causal)
        kv = torch.cat([ckv, kpe], dim=-1)
        return compute(pad(query, batch), kv, ckv, mask, batch, scale=scale, sinks=sinks, need_lse=return_lse)

    return run(groups, res, return_lse, step)
