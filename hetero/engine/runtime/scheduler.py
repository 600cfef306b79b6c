"""Continuous batching with chunked prefill and preemption by recompute."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Iterable

from hetero.engine.runtime.block_manager import BlockManager
from hetero.engine.runtime.cache_ops import CacheOp
from hetero.engine.runtime.sequence import Sequence, SequenceStatus
from hetero.errors import UsageError

__all__ = ["Scheduler", "ScheduledBatch"]


@dataclass
class ScheduledBatch:
    """What one step computes: ``seqs[i]`` gets ``query_lens[i]`` new rows, reaching KV length ``seq_lens[i]``.

    Decodes (query length 1) come first, then prefill chunks. ``sample[i]`` says whether
    row ``seq_lens[i] - 1`` is sampled (a chunk that leaves part of the prompt is not).
    ``preempted`` lists the sequences sent back to the waiting queue while scheduling;
    ``cache_ops`` the cache changes allocation decided, to apply before the step runs.
    """

    seqs: list[Sequence] = field(default_factory=list)
    query_lens: list[int] = field(default_factory=list)
    seq_lens: list[int] = field(default_factory=list)
    sample: list[bool] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    cache_ops: list[CacheOp] = field(default_factory=list)

    def add(self, seq: Sequence, query_len: int) -> None:
        self.seqs.append(seq)
        self.query_lens.append(query_len)
        self.seq_lens.append(seq.num_computed_tokens + query_len)
        self.sample.append(seq.num_computed_tokens + query_len == seq.num_tokens)

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


class Scheduler:
    """Decides each step which sequences compute how many tokens.

    A step first gives every running sequence with one token left to compute its decode
    row, then fills the rest of the ``max_num_batched_tokens`` budget (and the
    ``max_num_seqs`` slots) with prefill chunks: running sequences part-way through
    their prompt first, then waiting ones in arrival order. When a decode finds no free
    KV block, the most recently admitted running sequence is preempted: its blocks are
    freed and it goes back to the front of the waiting queue, to be recomputed from its
    prompt and generated tokens. For a model with per-sequence state under prefix
    caching, a prompt's prefill stops once at its last full block, where the state is
    snapshotted (``BlockManager.snapshots_state``): the next request that shares those
    blocks can then start from them.
    """

    def __init__(
        self,
        block_manager: BlockManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        eos_token_ids: Iterable[int] = (),
    ):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        """Queue ``seq``; UsageError (a ValueError) when it could never run.

        Refused: an empty prompt, a prompt longer than ``max_model_len``, and a request
        whose longest sequence needs more KV blocks than the cache has. A prompt that
        fits but leaves less than ``max_tokens`` room is accepted: its output stops at
        ``max_model_len`` tokens with finish reason "length".
        """
        n, params, who = seq.num_prompt_tokens, seq.sampling_params, _who(seq)
        if n == 0:
            raise UsageError(
                f"{who}: argument 'prompt': expected at least one token, got an empty prompt",
                arg="prompt",
                expected="at least one token",
                got=[],
            )
        if n > self.max_model_len:
            raise UsageError(
                f"{who}: argument 'prompt': prompt of {n} tokens is longer than max_model_len ({self.max_model_len})",
                arg="prompt",
                expected=f"<= {self.max_model_len} tokens",
                got=n,
            )
        longest = min(n + params.max_tokens - 1, self.max_model_len)
        needed = self.block_manager.blocks_needed(longest)
        if needed > self.block_manager.num_blocks:
            raise UsageError(
                f"{who}: prompt of {n} tokens with max_tokens={params.max_tokens} "
                f"needs {needed} KV blocks of {self.block_manager.block_size} tokens for {longest} tokens, "
                f"but the cache has {self.block_manager.num_blocks}",
                arg="max_tokens",
                expected=f"a request that fits {self.block_manager.num_blocks} KV blocks",
                got=params.max_tokens,
            )
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        """The next step's batch (decodes first, then prefill chunks)."""
        batch = ScheduledBatch()
        budget = self._schedule_decodes(batch)
        for seq in self.running:
            if budget == 0:
                break
            remaining = seq.num_tokens - seq.num_computed_tokens
            if remaining > 1:
                chunk = self._chunk(seq, budget)
                batch.add(seq, chunk)
                budget -= chunk
        if not batch.preempted:
            self._admit(batch, budget)
        batch.cache_ops = self.block_manager.take_ops()
        return batch

    def _schedule_decodes(self, batch: ScheduledBatch) -> int:
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if seq.num_tokens - seq.num_computed_tokens == 1:
                while not self.block_manager.can_append(seq):
                    victim = self.running[-1]
                    self._preempt(victim, batch)
                    if victim is seq:
                        return budget
                self.block_manager.append_slot(seq)
                batch.add(seq, 1)
                budget -= 1
            i += 1
        return budget

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        batch.preempted.append(seq)

    def _admit(self, batch: ScheduledBatch, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not self.block_manager.can_allocate(seq, reuse=seq.imported is None):
                break
            self.waiting.popleft()
            cached = self.block_manager.allocate(seq, reuse=seq.imported is None)
            if seq.imported is not None:
                self.block_manager.import_cache(seq, seq.imported)
                cached, seq.imported = seq.imported.num_tokens, None
            seq.num_computed_tokens = cached
            seq.num_cached_tokens = max(seq.num_cached_tokens, cached)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            chunk = self._chunk(seq, budget)
            batch.add(seq, chunk)
            budget -= chunk

    def _chunk(self, seq: Sequence, budget: int) -> int:
        """The rows of ``seq``'s prompt to compute now: what is left, within ``budget``; for a model whose
        state is snapshotted, cut at the last full block before the end, so that its state there is kept."""
        chunk = min(seq.num_tokens - seq.num_computed_tokens, budget)
        if self.block_manager.snapshots_state:
            bs = self.block_manager.block_size
            boundary = (seq.num_tokens - 1) // bs * bs
            if seq.num_computed_tokens < boundary < seq.num_computed_tokens + chunk:
                chunk = boundary - seq.num_computed_tokens
        return chunk

    def postprocess(self, batch: ScheduledBatch, sampled_ids: list[int]) -> list[Sequence]:
        """Account the computed rows, append the sampled tokens (one per sampled sequence, in
        batch order), and finish and free the sequences that stop; returns those."""
        sampled = iter(sampled_ids)
        finished = []
        for seq, query_len, sample in zip(batch.seqs, batch.query_lens, batch.sample):
            seq.num_computed_tokens += query_len
            self.block_manager.cache_computed(seq)
            if not sample:
                continue
            token = next(sampled)
            seq.output_token_ids.append(token)
            reason = self._finish_reason(seq, token)
            if reason is not None:
                self.finish(seq, reason)
                finished.append(seq)
        return finished

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        params = seq.sampling_params
        if (not params.ignore_eos and token in self.eos_token_ids) or token in params.stop_token_ids:
            return "stop"
        if len(seq.output_token_ids) >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def finish(self, seq: Sequence, reason: str) -> None:
        """End ``seq`` now (a stop condition, an abort or an error) and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason


def _who(seq: Sequence) -> str:
    """``request 3`` (its index), with the id when the caller chose one."""
    if seq.request_id == str(seq.index):
        return f"request {seq.index}"
    return f"request {seq.index} (id {seq.request_id!r})"
