"""What one engine step hands every layer: token positions, cache slots and the attention layout."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hetero.spec.types import AttentionMeta, Plan

__all__ = ["Step", "PrefillSpan", "TokenStates"]


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
class TokenStates:
    """Speculative decoding's per-token states (spec 1.11) for the step's first ``num_seqs`` sequences
    (its decodes, rows ``[0, num_tokens)``): ``slots`` int32 [num_seqs, 1 + k] their slot groups, the
    state after row t going to column t; ``num_accepted`` int32 [num_seqs]: 1 + the column each
    sequence's state is read from. The recurrent layers run these sequences through the per-token
    form and the rest through ``state_slots``."""

    num_seqs: int
    num_tokens: int
    slots: torch.Tensor
    num_accepted: torch.Tensor


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
    - ``state_plan``: the step plan of those state indices (``Ops.plan_recurrent``), for the
      recurrent ops' ``plan=``; ``meta`` and ``decode_meta`` carry their own (``meta.plan``).
      None when the engine does not plan (compiled steps).
    - ``token_states``: speculative decoding's per-token state slots of the leading sequences
      (``TokenStates``); None otherwise.
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
    state_plan: Plan | None = None
    token_states: TokenStates | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])
