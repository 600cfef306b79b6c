"""The gated delta rule over a padded batch of sequences and value heads: one state update for
decode, the chunked (WY / UT-transform) form for prefill, in chunks of ``CHUNK`` rows.

Within a chunk of C rows, with G the inclusive cumulative log-decay from the chunk's start and
S0 the state entering it (per head; G per key channel for KDA, where products below are
per channel)::

    S_i = exp(G_i) S0 + sum_{j<=i} exp(G_i - G_j) k_j u_j^T
    (I + A) U = beta V - beta exp(G) K S0,   A_ij = beta_i sum_r k_ir k_jr exp(G_ir - G_jr), j < i
    O = (q exp(G)) S0 + [sum_r q_ir k_jr exp(G_ir - G_jr)]_{j<=i} U
    S_C = exp(G_C) S0 + (k exp(G_C - G))^T U

so one unit-triangular solve per chunk (batched over chunks, sequences and heads) gives
U = X_v - X_k S0, and the loop over chunks carries S with three matrix products. Decay
ratios are formed as exp of differences, never as quotients: with g <= 0 no term exceeds 1.
Padding rows have k = 0, beta = 0, g = 0: they leave the state as it is.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["CHUNK", "decode_step", "chunked"]

#: rows per chunk of the prefill form
CHUNK = 64
#: elements of the largest per-chunk-pair temporary ([.., C, C, K] for KDA) computed at once
_BUDGET = 1 << 25


def decode_step(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, decay: torch.Tensor, beta: torch.Tensor, state: torch.Tensor
) -> torch.Tensor:
    """One row per sequence: q, k [B, HV, K], v [B, HV, V], decay exp(g) [B, HV, 1 or K], beta [B, HV];
    state [B, HV, K, V] (contiguous) updated in place. Returns out [B, HV, V].

    Reads S once for both products: k^T (D S) = (k D)^T S, and q^T S' = (q D)^T S + (q.k) u."""
    b, hv, kdim, vdim = state.shape
    both = torch.matmul(torch.stack([k * decay, q * decay], dim=2), state)  # [B, HV, 2, V]
    u = beta[..., None] * (v - both[:, :, 0])
    out = both[:, :, 1] + (q * k).sum(-1, keepdim=True) * u
    state.mul_(decay[..., None])
    state.view(b * hv, kdim, vdim).baddbmm_(k.reshape(b * hv, kdim, 1), u.reshape(b * hv, 1, vdim))
    return out


class _Terms(NamedTuple):
    """Per chunk, independent of the entering state: [n, B, HV, C, ...]."""

    xv: torch.Tensor  # (I + A)^-1 beta V                 [.., C, V]
    xk: torch.Tensor  # (I + A)^-1 beta exp(G) K          [.., C, K]
    qg: torch.Tensor  # q exp(G)                           [.., C, K]
    qk: torch.Tensor  # decayed q.k, j <= i                [.., C, C]
    kd: torch.Tensor  # k exp(G_C - G)                     [.., C, K]
    decay: torch.Tensor  # exp(G_C) shaped for S [K, V]   [.., 1 or K, 1]


def _decay_ratio(cum: torch.Tensor) -> torch.Tensor:
    """exp(G_i - G_j) for j <= i, else 0: [.., C, C] from cum [.., C, 1], [.., C, C, K] from cum [.., C, K]."""
    c = cum.shape[-2]
    causal = torch.ones(c, c, dtype=torch.bool, device=cum.device).tril()
    if cum.shape[-1] == 1:
        return torch.exp((cum - cum.transpose(-1, -2)).masked_fill_(~causal, float("-inf")))
    diff = cum[..., :, None, :] - cum[..., None, :, :]
    return torch.exp(diff.masked_fill_(~causal[..., None], float("-inf")))


def _gram(a: torch.Tensor, k: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """[sum_r a_ir k_jr ratio_ij(r)]: [.., C, C] from a, k [.., C, K] and ``_decay_ratio``'s ratio."""
    if ratio.ndim == k.ndim:
        return torch.matmul(a, k.transpose(-1, -2)).mul_(ratio)
    return torch.matmul(ratio * k[..., None, :, :], a[..., :, :, None])[..., 0]


def _terms(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> _Terms:
    """The state-independent terms of chunks q, k [.., C, K], v [.., C, V], g [.., C, 1 or K], beta [.., C]."""
    cum = g.cumsum(-2)
    ratio = _decay_ratio(cum)
    a = _gram(k, k, ratio).mul_(beta[..., None]).tril_(-1)
    growth = torch.exp(cum)
    rhs = beta[..., None] * torch.cat([v, growth * k], dim=-1)
    x = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)  # diagonal taken as 1: I + A
    last = cum[..., -1:, :]
    vdim = v.shape[-1]
    return _Terms(
        x[..., :vdim],
        x[..., vdim:],
        q * growth,
        _gram(q, k, ratio),
        k * torch.exp(last - cum),
        torch.exp(last).transpose(-1, -2),
    )


def _carry(t: _Terms, c: int, state: torch.Tensor) -> torch.Tensor:
    """Chunk c of the terms applied to ``state`` [B, HV, K, V] (updated in place); returns its out [B, HV, C, V]."""
    u = t.xv[c] - torch.matmul(t.xk[c], state)
    out = torch.matmul(t.qg[c], state) + torch.matmul(t.qk[c], u)
    state.mul_(t.decay[c]).add_(torch.matmul(t.kd[c].transpose(-1, -2), u))
    return out


def chunked(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor
) -> torch.Tensor:
    """Chunk-major operands: q, k [N, B, HV, C, K], v [N, B, HV, C, V], g [N, B, HV, C, 1 or K] (log-decay),
    beta [N, B, HV, C]; state [B, HV, K, V] updated in place. Returns out [N, B, HV, C, V]."""
    n, b, hv, size, _ = k.shape
    out = torch.empty(n, b, hv, size, v.shape[-1], dtype=v.dtype, device=v.device)
    group = max(1, _BUDGET // (b * hv * size * size * g.shape[-1] * 2))
    for c0 in range(0, n, group):
        part = slice(c0, c0 + group)
        terms = _terms(q[part], k[part], v[part], g[part], beta[part])
        for c in range(terms.xv.shape[0]):
            out[c0 + c] = _carry(terms, c, state)
    return out
