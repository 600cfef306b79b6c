"""The masked softmax of the torch backend's attention, over one padded group (``_attention_plan``).

The mask carries causality (bottom-right), the window, the padding and, in sparse MLA, the
listed positions; the softmax runs in float32 (float64 for float64 inputs) as batched matmuls,
or through torch's fused ``scaled_dot_product_attention`` when no softcap, sinks or lse are
asked. A row that sees no key gets out 0 and lse -inf.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from hetero_torch._attention_plan import Batch

__all__ = ["NEG_INF", "acc_dtype", "visible", "listed", "attend", "sdpa", "compute", "run"]

NEG_INF = float("-inf")


def acc_dtype(*xs: torch.Tensor | None) -> torch.dtype:
    """float64 when any given tensor is float64 (the oracle run), else float32."""
    return torch.float64 if any(x is not None and x.dtype == torch.float64 for x in xs) else torch.float32


def visible(batch: Batch, causal: bool, window: tuple[int, int]) -> torch.Tensor:
    """bool [B, Nmax, Lmax]: key j visible to padded row i of sequence b."""
    pos = batch.positions()[..., None]
    j = torch.arange(batch.length, device=pos.device)[None, None, :]
    mask = j < batch.k_lens[:, None, None]
    if causal:
        mask = mask & (j <= pos)
    if window[0] >= 0:
        mask = mask & (j >= pos - window[0])
    if window[1] >= 0:
        mask = mask & (j <= pos + window[1])
    return mask


def listed(indices: torch.Tensor, batch: Batch, causal: bool) -> torch.Tensor:
    """bool [B, Nmax, Lmax]: the positions each row of topk_indices [T, K] lists that are visible
    to it (``0 <= j <= pos`` when causal, ``j < L`` otherwise); every other entry is skipped."""
    idx = indices.index_select(0, batch.tok).to(torch.int64)
    pos = batch.positions()[batch.seq, batch.row][:, None]
    limit = pos if causal else batch.k_lens[batch.seq][:, None] - 1
    ok = (idx >= 0) & (idx <= limit)
    rows = torch.zeros(idx.shape[0], batch.length + 1, dtype=torch.bool, device=idx.device)
    rows.scatter_(1, torch.where(ok, idx, batch.length), True)  # column Lmax collects the skipped entries
    res = torch.zeros(batch.size, batch.n, batch.length, dtype=torch.bool, device=idx.device)
    res[batch.seq, batch.row] = rows[:, : batch.length]
    return res


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    *,
    scale: float,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked softmax attention of a padded batch, in the dtype of q (the accumulation dtype).

    q [B, N, Hq, D], k [B, L, Hkv, D], v [B, L, Hkv, Dv], mask bool [B, N, L]; sinks [Hq] join
    each row's denominator. Returns out [B, N, Hq, Dv] and lse [B, N, Hq] (sinks excluded);
    a row with no visible key gets 0 and -inf."""
    b, n, hq, d = q.shape
    length, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
    g = hq // hkv  # query head h reads KV head h // g
    qh = q.reshape(b, n, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, g * n, d)
    s = torch.matmul(qh, k.permute(0, 2, 3, 1)).view(b, hkv, g, n, length) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~mask[:, None, None], NEG_INF)
    lse = torch.logsumexp(s, dim=-1)  # [B, Hkv, G, N]
    denom = lse if sinks is None else torch.logaddexp(lse, sinks.to(lse.dtype).view(1, hkv, g, 1))
    denom = denom.masked_fill(denom == NEG_INF, 0.0)  # empty row: exp(-inf - 0) = 0, not NaN
    p = torch.exp(s - denom[..., None]).view(b, hkv, g * n, length)
    out = torch.matmul(p, v.permute(0, 2, 1, 3)).view(b, hkv, g, n, dv)
    return out.permute(0, 3, 1, 2, 4).reshape(b, n, hq, dv), lse.permute(0, 3, 1, 2).reshape(b, n, hq)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, *, scale: float) -> torch.Tensor:
    """The same attention (no softcap, sinks or lse) through torch's fused SDPA, in q's dtype:
    out [B, N, Hq, Dv]; a row with no visible key gets 0."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        attn_mask=mask[:, None],
        scale=scale,
        enable_gqa=k.shape[2] != q.shape[2],
    ).transpose(1, 2)
    return torch.where(mask.any(dim=-1)[..., None, None], out, 0.0)


def compute(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    batch: Batch,
    *,
    scale: float,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    need_lse: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The group's packed out [Tg, Hq, Dv] and lse float32 [Tg, Hq] (None unless asked) of padded
    q [Bg, n, Hq, D] over padded k, v under mask."""
    if softcap == 0 and sinks is None and not need_lse:
        return sdpa(q, k, v, mask, scale=scale)[batch.seq, batch.row], None
    acc = acc_dtype(q, sinks)
    o, lse = attend(q.to(acc), k.to(acc), v.to(acc), mask, scale=scale, softcap=softcap, sinks=sinks)
    return o[batch.seq, batch.row], lse[batch.seq, batch.row].to(torch.float32)


def run(
    batches: list[Batch],
    res: torch.Tensor,
    return_lse: bool,
    step: Callable[[Batch], tuple[torch.Tensor, torch.Tensor | None]],
):
    """Write each group's packed result ``step(batch)`` into its rows of res [T, H, Dv]; return
    res, or (res, lse float32 [T, H]) with return_lse. Every row belongs to one group."""
    lse = torch.full(res.shape[:2], NEG_INF, dtype=torch.float32, device=res.device) if return_lse else None
    for batch in batches:
        o, part = step(batch)
        res.index_copy_(0, batch.tok, o.to(res.dtype))
        if lse is not None:
            lse.index_copy_(0, batch.tok, part)
    return (res, lse) if return_lse else res
