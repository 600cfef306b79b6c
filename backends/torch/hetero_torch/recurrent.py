"""Recurrent ops of linear-attention layers from torch's batched operators: the short causal
convolution and the gated delta rule, each continuing a per-sequence state slot.

Every op validates as the reference does (shapes, dtypes, devices, then the index values on the
host, so every gather and scatter index is in range on any device), then runs over the sequences
that own a slot and rows at once, in a few padded groups [B, L, ...] (``_recurrent_plan``: one
for a decode batch, which needs no padding). ``causal_conv1d`` prepends each sequence's initial
state and sums W shifted products; ``gated_delta_rule`` is one batched state update for decode
and the chunked WY form for prefill (``_recurrent_delta``). Accumulation is float32 (float64
when any input is float64); outputs take the input's dtype, states keep theirs, and each state
is written with one index op. Per-token state slots [N, M] (spec 1.11) run in ``_recurrent_tokens``.
Semantics: ``hetero.spec.recurrent``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hetero.spec.checks import (
    L2NORM_EPS,
    check_causal_conv1d,
    check_gated_delta_rule,
    check_num_accepted_tokens,
    check_state_batch,
)
from hetero.spec.types import Plan
from hetero_torch import _recurrent_plan, _recurrent_tokens, _step_plan
from hetero_torch._layers_util import acc_dtype
from hetero_torch._recurrent_delta import CHUNK, chunked, decode_step
from hetero_torch._recurrent_plan import Batch

__all__ = ["causal_conv1d", "gated_delta_rule"]


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    query_start_loc: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    *,
    activation: str | None = "silu",
    plan: Plan | None = None,
    num_accepted_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    op = "causal_conv1d"
    tokens, channels, width, num_slots = check_causal_conv1d(
        op, x, weight, bias, conv_state, query_start_loc, state_slots, has_initial_state, activation
    )
    check_num_accepted_tokens(op, state_slots, num_accepted_tokens)
    if state_slots.ndim == 2:
        w = weight.to(acc_dtype(x, weight, bias, conv_state))
        index = (query_start_loc, state_slots, has_initial_state)
        return _recurrent_tokens.conv_tokens(op, x, w, bias, conv_state, index, num_accepted_tokens, activation)
    groups = _groups(op, (query_start_loc, state_slots, has_initial_state), tokens, num_slots, plan, x.device, None)
    out = torch.zeros(tokens, channels, dtype=x.dtype, device=x.device)  # rows of skipped sequences stay 0
    acc = acc_dtype(x, weight, bias, conv_state)
    for batch in groups:
        _conv_group(batch, x, weight.to(acc), bias, conv_state, out, activation)
    return out


def _groups(
    op: str,
    index: tuple[torch.Tensor, ...],
    tokens: int,
    num_slots: int,
    plan: Plan | None,
    device: torch.device,
    chunk: int | None,
) -> list[Batch]:
    """The padded groups of the call: the step plan's when it serves these index tensors, else built
    from their values, checked here (every gather and scatter index is then in range)."""
    planned = _step_plan.recurrent(plan, index, tokens, num_slots)
    if planned is not None:
        return planned.groups(device, chunk)
    return _recurrent_plan.plan(*check_state_batch(op, *index, tokens, num_slots), device, chunk)


def _conv_group(
    batch: Batch,
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    out: torch.Tensor,
    activation: str | None,
) -> None:
    """One padded group of causal_conv1d, w [C, W] in the accumulation dtype."""
    acc, width = w.dtype, w.shape[1]
    xx = torch.cat([batch.initial_state(conv_state, x.dtype), batch.pad(x)], dim=1)  # [B, W-1+L, C], exact copies
    xa = xx.to(acc)
    y = sum(w[:, j] * xa[:, j : j + batch.length] for j in range(width))  # y[t] = sum_j weight[:, j] * xx[t+j]
    if bias is not None:
        y = y + bias.to(acc)
    if activation == "silu":
        y = F.silu(y)
    batch.scatter(out, y.to(x.dtype))
    conv_state.index_copy_(0, batch.slots, _last_inputs(xx, batch, width))


def _last_inputs(xx: torch.Tensor, batch: Batch, width: int) -> torch.Tensor:
    """Each sequence's last W-1 inputs xx[b, L_b : L_b + W-1] (its old state when L_b < W-1)."""
    if batch.decode:
        return xx[:, 1:]
    idx = batch.lens[:, None] + torch.arange(width - 1, device=xx.device)[None, :]
    return xx.gather(1, idx[..., None].expand(-1, -1, xx.shape[2]))


def _l2n(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum(x**2) + eps) over the last dimension (eps inside the root, as the spec states)."""
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + L2NORM_EPS)


def _chunk_major(x: torch.Tensor, size: int, ratio: int = 1) -> torch.Tensor:
    """[B, L, H, ...] to [L / size, B, H * ratio, size, ...] (head h repeated ``ratio`` times), one copy."""
    b, length, h = x.shape[:3]
    x = x.view(b, length // size, size, h, *x.shape[3:]).transpose(0, 1).transpose(2, 3)
    if ratio == 1:
        return x.contiguous()
    x = x.unsqueeze(3).expand(-1, -1, -1, ratio, *x.shape[3:])
    return x.reshape(length // size, b, h * ratio, *x.shape[4:])


def _inputs(
    batch: Batch,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float,
    l2norm: bool,
    acc: torch.dtype,
) -> tuple[torch.Tensor, ...]:
    """The padded operands, chunk-major [N, B, HV, C, ...] in ``acc`` (C = min(CHUNK, L)): scale * normalized q
    and normalized k expanded to value heads, v, g [.., 1 or K] and beta; k, v, g and beta 0 on padding
    rows (so they leave the state alone; q's padding rows only make discarded outputs)."""
    ratio, size = v.shape[1] // q.shape[1], min(CHUNK, batch.length)
    qs, ks = batch.pad(q).to(acc), batch.pad(k, True).to(acc)
    if l2norm:
        qs, ks = _l2n(qs), _l2n(ks)
    qs, ks = _chunk_major(qs * float(scale), size, ratio), _chunk_major(ks, size, ratio)
    gs = batch.pad(g if g.ndim == 3 else g[..., None], True).to(acc)
    vs, bs = batch.pad(v, True).to(acc), batch.pad(beta, True).to(acc)
    return qs, ks, _chunk_major(vs, size), _chunk_major(gs, size), _chunk_major(bs, size)


def _delta_rule(batch: Batch, operands: tuple[torch.Tensor, ...], state: torch.Tensor) -> torch.Tensor:
    """out [B, L, HV, V] of ``_inputs``' operands, ``state`` [B, HV, K, V] carried in place."""
    q, k, v, g, beta = operands
    if batch.decode:
        return decode_step(
            q[0, ..., 0, :], k[0, ..., 0, :], v[0, ..., 0, :], torch.exp(g[0, ..., 0, :]), beta[0, ..., 0], state
        )[:, None]
    y = chunked(q, k, v, g, beta, state)  # [N, B, HV, C, V]
    return y.permute(1, 0, 3, 2, 4).reshape(batch.size, batch.length, y.shape[2], y.shape[4])


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm_state: torch.Tensor,
    query_start_loc: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    *,
    scale: float,
    use_qk_l2norm: bool = True,
    plan: Plan | None = None,
    num_accepted_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    op = "gated_delta_rule"
    tokens, _, _, vheads, vdim, num_slots = check_gated_delta_rule(
        op, q, k, v, g, beta, ssm_state, query_start_loc, state_slots, has_initial_state, scale, use_qk_l2norm
    )
    check_num_accepted_tokens(op, state_slots, num_accepted_tokens)
    index = (query_start_loc, state_slots, has_initial_state)
    out = torch.zeros(tokens, vheads, vdim, dtype=v.dtype, device=v.device)  # rows of skipped sequences stay 0
    acc = acc_dtype(q, k, v, g, beta, ssm_state)
    if state_slots.ndim == 2:
        planned = _recurrent_tokens.delta_batch(op, index, num_accepted_tokens, tokens, num_slots, v.device)
        if planned is not None:
            batch, writes = planned
            operands = _inputs(batch, q, k, v, g, beta, scale=scale, l2norm=use_qk_l2norm, acc=acc)
            batch.scatter(out, _recurrent_tokens.delta_tokens(operands, batch, ssm_state, writes).to(v.dtype))
        return out
    groups = _groups(op, index, tokens, num_slots, plan, v.device, CHUNK)
    for batch in groups:
        operands = _inputs(batch, q, k, v, g, beta, scale=scale, l2norm=use_qk_l2norm, acc=acc)
        state = batch.initial_state(ssm_state, acc)
        batch.scatter(out, _delta_rule(batch, operands, state).to(v.dtype))
        ssm_state.index_copy_(0, batch.slots, state.to(ssm_state.dtype))
    return out
