"""The per-request walk of ``rejection_sample`` (spec 1.10) in torch operators, shared by the torch backend and
the Triton path (no Triton here): where each draft token sits, and the tokens each request emits once every
draft position's verdict is known."""

from __future__ import annotations

import torch

__all__ = ["draft_positions", "emitted"]


def draft_positions(
    cu_num_draft_tokens: torch.Tensor, n: int, batch: int, max_spec_len: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(k_b per request, each draft token's request, its position j in that request), all int64 and clamped so
    that malformed offsets (unchecked with validation off) index nothing outside. ``batch`` must be > 0."""
    cu = cu_num_draft_tokens.to(torch.int64)
    counts = (cu[1:] - cu[:-1]).clamp(0, max_spec_len)
    tokens = torch.arange(n, device=cu.device)
    req = torch.searchsorted(cu[1:].contiguous(), tokens, right=True).clamp(max=batch - 1)
    return counts, req, (tokens - cu[req]).clamp(0, max_spec_len)


def emitted(
    accepted: torch.Tensor,
    token: torch.Tensor,
    draft: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    counts: torch.Tensor,
    req: torch.Tensor,
    j: torch.Tensor,
    width: int,
) -> torch.Tensor:
    """int32 [B, width]: each request's accepted prefix of ``draft``, then its first rejection's ``token`` or its
    bonus token (at k_b), then -1."""
    batch = counts.shape[0]
    ok = torch.zeros(batch, width, dtype=torch.bool, device=counts.device)
    tok = torch.full((batch, width), -1, dtype=torch.int64, device=counts.device)
    ok[req, j], tok[req, j] = accepted, torch.where(accepted, draft, token)
    n_ok = torch.cumprod(ok.to(torch.int64), dim=1).sum(dim=1)  # the accepted prefix of each request
    tok.scatter_(1, counts[:, None], bonus_token_ids.to(torch.int64)[:, None])
    cols = torch.arange(width, device=counts.device)[None, :]
    return torch.where(cols <= n_ok[:, None], tok, -1).to(torch.int32)
