"""The recurrent ops with per-token state slots [N, M] (spec 1.11: speculative decoding's verify calls).

Every sequence has at most M rows (a few: 1 + the draft tokens), so both ops run over one padded
batch of the live sequences. ``causal_conv1d`` is the [N] path's sum of W shifted products, and
each per-token state is a window of the padded inputs, written with one index op.
``gated_delta_rule`` steps the rows one at a time, every sequence at once (``decode_step``, padding
rows with k = 0, beta = 0, g = 0 leaving the state alone), and copies the states of the rows that
name a slot after each step. The initial states are gathered before any write: a sequence may
write the slot it read. Semantics: ``hetero.spec.recurrent``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hetero.spec.checks import check_token_slots
from hetero_torch._recurrent_delta import CHUNK, decode_step
from hetero_torch._recurrent_plan import Batch, _batch

__all__ = ["conv_tokens", "delta_batch", "delta_tokens"]


def _live(
    op: str, index: tuple[torch.Tensor, ...], accepted: torch.Tensor | None, tokens: int, num_slots: int
) -> tuple[list[int], list[list[int]], list[int], list[int], list[bool]]:
    """(starts, slot rows, the live sequences, the slot each reads, whether it reads), checked."""
    starts, rows, initial, cols = check_token_slots(op, *index, accepted, tokens, num_slots)
    live = [n for n, row in enumerate(rows) if row[0] >= 0 and starts[n + 1] > starts[n]]
    # a sequence without an initial state names its first slot, never read (initial_state masks it)
    read = [row[cols[n]] if initial[n] else row[0] for n, row in enumerate(rows)]
    return starts, rows, live, read, initial


def _writes(starts: list[int], rows: list[list[int]], live: list[int]) -> list[tuple[int, int, int]]:
    """(position in the batch, row t, slot) of every per-token state write, row by row."""
    return sorted(
        ((b, t, rows[n][t]) for b, n in enumerate(live) for t in range(starts[n + 1] - starts[n]) if rows[n][t] >= 0),
        key=lambda w: w[1],
    )


def conv_tokens(
    op: str,
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    index: tuple[torch.Tensor, ...],
    accepted: torch.Tensor | None,
    activation: str | None,
) -> torch.Tensor:
    """causal_conv1d over per-token slots, w [C, W] in the accumulation dtype."""
    out = torch.zeros_like(x)  # rows of skipped sequences stay 0
    starts, rows, live, read, initial = _live(op, index, accepted, x.shape[0], conv_state.shape[0])
    if not live:
        return out
    batch = _batch(starts, read, initial, live, x.device, None)
    width = w.shape[1]
    xx = torch.cat([batch.initial_state(conv_state, x.dtype), batch.pad(x)], dim=1)  # [B, W-1+L, C]
    xa = xx.to(w.dtype)
    y = sum(w[:, j] * xa[:, j : j + batch.length] for j in range(width))
    if bias is not None:
        y = y + bias.to(w.dtype)
    if activation == "silu":
        y = F.silu(y)
    batch.scatter(out, y.to(x.dtype))
    writes = _writes(starts, rows, live)
    if writes:
        b, t, slot = (torch.tensor(c, dtype=torch.int64, device=x.device) for c in zip(*writes))
        window = t[:, None] + 1 + torch.arange(width - 1, device=x.device)  # xx[t+1 : t+W], exact copies
        conv_state.index_copy_(0, slot, xx[b[:, None], window])
    return out


def delta_tokens(
    operands: tuple[torch.Tensor, ...],
    batch: Batch,
    ssm_state: torch.Tensor,
    writes: list[tuple[int, int, int]],
) -> torch.Tensor:
    """gated_delta_rule's rows one at a time over chunk-major operands [N, B, HV, C, ...] (``_inputs``);
    returns out [B, L, HV, V] in the accumulation dtype."""
    q, k, v, g, beta = operands
    size = q.shape[3]
    state = batch.initial_state(ssm_state, q.dtype).contiguous()
    out = torch.empty(batch.size, batch.length, v.shape[2], v.shape[4], dtype=q.dtype, device=q.device)
    dev = {"dtype": torch.int64, "device": q.device}
    for t in range(batch.length):
        c, i = divmod(t, size)
        out[:, t] = decode_step(
            q[c, :, :, i], k[c, :, :, i], v[c, :, :, i], torch.exp(g[c, :, :, i]), beta[c, :, :, i], state
        )
        now = [(b, slot) for b, row, slot in writes if row == t]
        if now:
            pos, slots = torch.tensor([b for b, _ in now], **dev), torch.tensor([s for _, s in now], **dev)
            ssm_state.index_copy_(0, slots, state.index_select(0, pos).to(ssm_state.dtype))
    return out


def delta_batch(
    op: str, index: tuple[torch.Tensor, ...], accepted: torch.Tensor | None, tokens: int, num_slots: int, device
) -> tuple[Batch, list[tuple[int, int, int]]] | None:
    """The padded batch of a per-token gated_delta_rule call (rows padded to whole chunks) and its
    writes; None when no sequence is live."""
    starts, rows, live, read, initial = _live(op, index, accepted, tokens, num_slots)
    if not live:
        return None
    return _batch(starts, read, initial, live, device, CHUNK), _writes(starts, rows, live)
