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
    - ``state_slots`` int64 [B]: each sequence's slot in the state pool, and
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
        ``state_slots[b]``: its state slot (models with per-sequence state).
        """
        num_decodes = 0
        while num_decodes < len(query_lens) and query_lens[num_decodes] == 1:
            num_decodes += 1
        positions: list[int] = []
        slots: list[int] = []
        for n, length, blocks in zip(query_lens, seq_lens, block_tables):
            for pos in range(length - n, length):
                positions.append(pos)
                slots.append(blocks[pos // block_size] * block_size + pos % block_size)
        width = max((len(b) for b in block_tables), default=0)
        table = [list(b) + [0] * (width - len(b)) for b in block_tables]
        meta = AttentionMeta.build(query_lens, seq_lens, table, device=device)
        decode_meta = None
        if num_decodes:
            decode_meta = AttentionMeta.build(query_lens[:num_decodes], seq_lens[:num_decodes],
                                              table[:num_decodes], device=device)
        prefill = None
        if num_decodes < len(query_lens):
            prefill = _prefill_span(query_lens, seq_lens, block_tables, block_size, num_decodes, device)
        ends, rows = 0, []
        for b, n in enumerate(query_lens):
            ends += n
            if sample is None or sample[b]:
                rows.append(ends - 1)
        return cls(
            positions=torch.tensor(positions, dtype=torch.int64, device=device),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            meta=meta,
            num_decodes=num_decodes,
            decode_meta=decode_meta,
            prefill=prefill,
            logits_indices=torch.tensor(rows, dtype=torch.int64, device=device),
            state_slots=None if state_slots is None else torch.tensor(list(state_slots), dtype=torch.int64, device=device),
            has_initial_state=None if state_slots is None else torch.tensor(
                [length > n for n, length in zip(query_lens, seq_lens)], dtype=torch.bool, device=device),
        )


def _prefill_span(query_lens, seq_lens, block_tables, block_size, first, device) -> PrefillSpan:
    cu_q, cu_k, kv_slots = [0], [0], []
    for n, length, blocks in zip(query_lens[first:], seq_lens[first:], block_tables[first:]):
        cu_q.append(cu_q[-1] + n)
        cu_k.append(cu_k[-1] + length)
        kv_slots.extend(blocks[p // block_size] * block_size + p % block_size for p in range(length))
    return PrefillSpan(
        first_seq=first,
        first_token=sum(query_lens[:first]),
        cu_seqlens_q=torch.tensor(cu_q, dtype=torch.int32, device=device),
        cu_seqlens_k=torch.tensor(cu_k, dtype=torch.int32, device=device),
        max_seqlen_q=max(query_lens[first:]),
        max_seqlen_k=max(seq_lens[first:]),
        kv_slots=torch.tensor(kv_slots, dtype=torch.int64, device=device),
    )
