"""One step as plain host data: what the model runner needs, and what rank 0 broadcasts under TP."""

from __future__ import annotations

from dataclasses import dataclass, field

from hetero.engine.runtime.batch import ScheduledBatch
from hetero.engine.runtime.cache_ops import CacheOp

__all__ = ["StepPlan"]


@dataclass
class StepPlan:
    """The rows of one step: sequence b computes ``query_lens[b]`` rows ending at KV length
    ``seq_lens[b]``, over the blocks ``block_tables[b]`` (and state slot ``state_slots[b]``),
    from the token ids ``input_ids`` (all rows, in order); ``sample[b]``: whether its last
    row is sampled. ``spec_lens[b]`` (speculative decoding): how many of its rows are draft
    tokens, its last rows, all of them sampled with the row before them (None: no drafts).
    With drafts and per-sequence state, the leading decode sequences verify through per-token
    state slots: ``token_slots[b]`` their slot groups, ``num_accepted[b]`` 1 + their state's column.
    ``cache_ops`` are applied first, even when there are no rows."""

    input_ids: list[int] = field(default_factory=list)
    query_lens: list[int] = field(default_factory=list)
    seq_lens: list[int] = field(default_factory=list)
    block_tables: list[list[int]] = field(default_factory=list)
    sample: list[bool] = field(default_factory=list)
    state_slots: list[int] | None = None
    cache_ops: list[CacheOp] = field(default_factory=list)
    spec_lens: list[int] | None = None
    token_slots: list[list[int]] | None = None
    num_accepted: list[int] | None = None

    @classmethod
    def of(cls, batch: ScheduledBatch, stateful: bool, state_group: int = 1) -> "StepPlan":
        ids: list[int] = []
        for seq, n, length, drafts in zip(batch.seqs, batch.query_lens, batch.seq_lens, batch.drafts):
            ids.extend(seq.tokens(length - n, length - len(drafts)))
            ids.extend(drafts)
        spec = [len(d) for d in batch.drafts]
        token_slots = num_accepted = None
        if stateful and any(spec):
            verified = batch.seqs[: batch.num_decode_seqs]
            token_slots = [[s.state_slot + j for j in range(state_group)] for s in verified]
            num_accepted = [s.state_column + 1 for s in verified]
        return cls(
            ids,
            list(batch.query_lens),
            list(batch.seq_lens),
            [list(t) for t in batch.block_tables],
            list(batch.sample),
            [seq.state_slot + seq.state_column for seq in batch.seqs] if stateful else None,
            list(batch.cache_ops),
            spec if any(spec) else None,
            token_slots,
            num_accepted,
        )

    @property
    def num_sampled(self) -> int:
        return sum(self.sample)

    @property
    def num_logits(self) -> list[int]:
        """Per sequence, the rows whose logits are computed: 0, 1, or 1 + its drafts."""
        spec = self.spec_lens or [0] * len(self.sample)
        return [(1 + k) if s else 0 for s, k in zip(self.sample, spec)]
