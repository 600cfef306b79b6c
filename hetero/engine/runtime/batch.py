"""What one step computes, as the scheduler decided it."""

from __future__ import annotations

from dataclasses import dataclass, field

from hetero.engine.runtime.cache_ops import CacheOp
from hetero.engine.runtime.sequence import Sequence

__all__ = ["ScheduledBatch"]


@dataclass
class ScheduledBatch:
    """What one step computes: ``seqs[i]`` gets ``query_lens[i]`` new rows, reaching KV length ``seq_lens[i]``.

    Decodes (query length 1) come first, then prefill chunks. ``sample[i]`` says whether
    row ``seq_lens[i] - 1`` is sampled (a chunk that leaves part of the prompt is not).
    ``preempted`` lists the sequences sent back to the waiting queue while scheduling;
    ``cache_ops`` the cache changes allocation decided, to apply before the step runs.
    ``drafts[i]``: the draft tokens ``seqs[i]`` verifies (speculative decoding): its rows are its
    last token and these, all of them sampled. ``num_decode_seqs``: the leading sequences the
    scheduler gave their decode (one row, or one and their drafts).
    """

    seqs: list[Sequence] = field(default_factory=list)
    query_lens: list[int] = field(default_factory=list)
    seq_lens: list[int] = field(default_factory=list)
    sample: list[bool] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    cache_ops: list[CacheOp] = field(default_factory=list)
    drafts: list[list[int]] = field(default_factory=list)
    num_decode_seqs: int = 0

    def add(self, seq: Sequence, query_len: int, drafts: list[int] | None = None) -> None:
        drafts = drafts or []
        self.seqs.append(seq)
        self.query_lens.append(query_len)
        self.seq_lens.append(seq.num_computed_tokens + query_len)
        self.sample.append(seq.num_computed_tokens + query_len - len(drafts) == seq.num_tokens)
        self.drafts.append(drafts)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    @property
    def num_decodes(self) -> int:
        """Leading sequences with one query row (as ``build_step`` counts them)."""
        n = 0
        while n < len(self.query_lens) and self.query_lens[n] == 1:
            n += 1
        return n

    @property
    def block_tables(self) -> list[list[int]]:
        return [seq.block_table for seq in self.seqs]

    @property
    def sampled_seqs(self) -> list[Sequence]:
        return [seq for seq, s in zip(self.seqs, self.sample) if s]

    def __len__(self) -> int:
        return len(self.seqs)
