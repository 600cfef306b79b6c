"""What one engine step hands every layer: token positions, cache slots and the attention layout."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from hetero.spec.types import AttentionMeta

__all__ = ["Step", "PrefillSpan"]


@dataclass(frozen=True)
class PrefillSpan:
    """The prefill sequences of a step in the form dense (non-paged) attention wants.

    They are the step's sequences ``[first_seq, num_seqs)`` and own query rows
    ``[first_token, T)``. ``cu_seqlens_q`` / ``cu_seqlens_k`` int32 [P+1] are the
    cumulative query and KV lengths of those P sequences (KV includes cached
    context and the new tokens); ``kv_slots`` int64 [sum of KV lengths] lists the
    cache slot of every KV position of each sequence in order, so a layer can
    gather the whole context back from its paged cache (MLA prefill does).
    """

    first_seq: int
    first_token: int
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    kv_slots: torch.Tensor


@dataclass(frozen=True)
class Step:
    """One forward pass over a packed batch: decode sequences first, then prefill chunks.

    - ``positions`` int64 [T]: the position of each query row in its sequence.
    - ``slot_mapping`` int64 [T]: cache slot (block * block_size + offset) of each new token.
    - ``meta``: the ``AttentionMeta`` of every sequence of the step (paged attention).
    - ``num_decodes``: the first ``num_decodes`` sequences have exactly one query row
      each (rows ``[0, num_decodes)``); ``decode_meta`` is their own AttentionMeta
      (None when there are none).
    - ``prefill``: the remaining sequences as a ``PrefillSpan`` (None when there are none).
    - ``logits_indices`` int64 [S]: the rows whose logits are sampled (the last row of
      each sequence that completes its prompt or decodes).
    - ``state_slots`` int32 [B]: each sequence's slot in the state pool, and
      ``has_initial_state`` bool [B]: whether it had tokens computed before this step
      (None for models without per-sequence state).
    """

    positions: torch.Tensor
    slot_mapping: torch.Tensor
    meta: AttentionMeta
    num_decodes: int
    decode_meta: AttentionMeta | None
    prefill: PrefillSpan | None
    logits_indices: torch.Tensor
    state_slots: torch.Tensor | None = None
    has_initial_state: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])

    @classmethod
    def build(
        cls,
        query_lens: Sequence[int],
        seq_lens: Sequence[int],
        block_tables: Sequence[Sequence[int]],
        block_size: int,
        device: torch.device | str,
        sample: Sequence[bool] | None = None,
        state_slots: Sequence[int] | None = None,
    ) -> "Step":
        """Build a step from host lists. Sequences with one query row must come first.

        ``sample[b]``: whether sequence b's last row is sampled (default: all);
        ``state_slots[b]``: its state slot (models with per-sequence state). The block
        table is padded with 0 to the longest row. This goes through ``StepBuffers``
        sized to this one batch, the code path of the engine's persistent buffers.
        """
        # imported here: step_buffers builds Step objects, so it imports this module
        from hetero.engine.step_buffers import StepBuffers

        width = max((len(b) for b in block_tables), default=0)
        buffers = StepBuffers(sum(query_lens), len(query_lens), width * block_size, block_size, device,
                              has_state=state_slots is not None, kv_slots_capacity=0)
        step, _ = buffers.fill(query_lens, seq_lens, block_tables, sample=sample, state_slots=state_slots)
        return step
