"""varlen_attention (dense packed sequences, no cache) and merge_attention, batched with torch ops.

Semantics: ``hetero.spec.attention``; the padded batch and the masked softmax are ``_attention_core``'s.
"""

from __future__ import annotations

import torch

from hetero.spec.checks import STAT_DTYPES, check_options, check_same_device, check_tensor, check_varlen
from hetero.spec.types import FLOAT_DTYPES
from hetero_torch._attention_core import NEG_INF, acc_dtype, compute, run, visible
from hetero_torch._attention_plan import Batch, pad, pad_keys, plan

__all__ = ["varlen_attention", "merge_attention"]


def varlen_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    scale: float,
    causal: bool = True,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    op = "varlen_attention"
    scale, window, softcap = check_options(op, scale, causal, window, softcap, return_lse)
    cq, ck = check_varlen(op, query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    tq, hq = query.shape[:2]
    res = query.new_empty(tq, hq, value.shape[2])
    key_starts = cu_seqlens_k[:-1].to(torch.int64)

    def step(batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None]:
        k, v = pad_keys(key, key_starts, batch), pad_keys(value, key_starts, batch)
        return compute(
            pad(query, batch),
            k,
            v,
            visible(batch, causal, window),
            batch,
            scale=scale,
            softcap=softcap,
            need_lse=return_lse,
        )

    k_lens = [ck[b + 1] - ck[b] for b in range(len(ck) - 1)]
    return run(plan(cq, k_lens, hq, query.device), res, return_lse, step)


def merge_attention(
    out_a: torch.Tensor,
    lse_a: torch.Tensor,
    out_b: torch.Tensor,
    lse_b: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    op = "merge_attention"
    check_tensor(op, "out_a", out_a, ndim=3, dtypes=FLOAT_DTYPES)
    check_tensor(op, "out_b", out_b, shape=tuple(out_a.shape), dtypes=(out_a.dtype,))
    check_tensor(op, "lse_a", lse_a, shape=tuple(out_a.shape[:2]), dtypes=STAT_DTYPES)
    check_tensor(op, "lse_b", lse_b, shape=tuple(out_a.shape[:2]), dtypes=STAT_DTYPES)
    check_same_device(op, out_a=out_a, lse_a=lse_a, out_b=out_b, lse_b=lse_b)
    acc = acc_dtype(out_a, lse_a, lse_b)
    la, lb = lse_a.to(acc), lse_b.to(acc)
    lse = torch.logaddexp(la, lb)
    ref = lse.masked_fill(lse == NEG_INF, 0.0)  # both sides empty: weights exp(-inf) = 0
    wa, wb = torch.exp(la - ref)[..., None], torch.exp(lb - ref)[..., None]
    out = torch.where(wa > 0, wa * out_a.to(acc), 0.0) + torch.where(wb > 0, wb * out_b.to(acc), 0.0)
    return out.to(out_a.dtype), lse.to(torch.float32)
