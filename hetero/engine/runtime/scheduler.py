"""Continuous batching with chunked prefill and preemption by recompute."""

from __future__ import annotations

from collections import deque
from typing import Iterable

from hetero.engine.runtime.batch import ScheduledBatch
from hetero.engine.runtime.block_manager import BlockManager
from hetero.engine.runtime.sequence import Sequence, SequenceStatus
from hetero.errors import UsageError

__all__ = ["Scheduler", "ScheduledBatch"]


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

    Speculative decoding: a decoding sequence with ``draft_token_ids`` verifies them in its decode
    (1 + k rows, k cut to the budget, ``max_model_len`` and ``max_tokens``), with blocks for them and
    ``num_lookahead_tokens`` positions more, where the proposer writes the next step's draft KV.
    ``postprocess`` counts only the accepted rows as computed (``num_computed_tokens`` moves past the
    accepted drafts and no further), so a block holding a rejected token is never hashed.

    Pipeline parallelism: the sequences in ``in_flight`` (a step of theirs is still in the pipeline) are
    neither scheduled nor preempted until their step's tokens come back.
    """

    def __init__(
        self,
        block_manager: BlockManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        eos_token_ids: Iterable[int] = (),
        num_lookahead_tokens: int = 0,
    ):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.num_lookahead_tokens = num_lookahead_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.in_flight: set[Sequence] = set()
        self._cap = max_num_seqs
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

    def schedule(self, max_seqs: int | None = None) -> ScheduledBatch:
        """The next step's batch (decodes first, then prefill chunks), of at most ``max_seqs`` sequences
        (pipeline parallelism spreads the running sequences over its micro-batches)."""
        batch = ScheduledBatch()
        self._cap = max_seqs or self.max_num_seqs
        budget = self._schedule_decodes(batch)
        for seq in self.running:
            if budget == 0 or len(batch) >= self._cap:
                break
            remaining = seq.num_tokens - seq.num_computed_tokens
            if remaining > 1 and seq not in self.in_flight:
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
        while i < len(self.running) and budget > 0 and len(batch) < self._cap:
            seq = self.running[i]
            if seq.num_tokens - seq.num_computed_tokens == 1 and seq not in self.in_flight:
                drafts = self._drafts(seq, budget)
                extra = self._room(seq, len(drafts) + self.num_lookahead_tokens)
                while not self.block_manager.can_append(seq, extra):
                    victim = next((s for s in reversed(self.running) if s not in self.in_flight), seq)
                    self._preempt(victim, batch)
                    if victim is seq:
                        return budget
                self.block_manager.append_slot(seq, extra)
                batch.add(seq, 1 + len(drafts), drafts)
                batch.num_decode_seqs += 1
                budget -= 1 + len(drafts)
            i += 1
        return budget

    def _drafts(self, seq: Sequence, budget: int) -> list[int]:
        """The drafts ``seq`` verifies now: no more than the budget, ``max_model_len`` and the tokens it may
        still emit (1 + k at most) leave room for."""
        params = seq.sampling_params
        k = min(
            len(seq.draft_token_ids),
            budget - 1,
            self.max_model_len - seq.num_tokens,
            params.max_tokens - len(seq.output_token_ids) - 1,
        )
        return seq.draft_token_ids[: max(k, 0)]

    def _room(self, seq: Sequence, extra: int) -> int:
        """``extra`` positions after ``seq``'s tokens, cut at ``max_model_len``."""
        return max(0, min(extra, self.max_model_len - seq.num_tokens))

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = 0
        seq.draft_token_ids, seq.draft_probs = [], None
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        batch.preempted.append(seq)

    def _admit(self, batch: ScheduledBatch, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and len(batch) < self._cap:
            seq = self.waiting[0]
            reuse, extra = seq.imported is None, self._room(seq, self.num_lookahead_tokens)
            if not self.block_manager.can_allocate(seq, reuse, extra):
                break
            self.waiting.popleft()
            cached = self.block_manager.allocate(seq, reuse, extra)
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

    def postprocess(self, batch: ScheduledBatch, emitted: list[list[int] | int]) -> list[Sequence]:
        """Account the computed rows, append the emitted tokens (one list per sampled sequence, in
        batch order: one sampled token, or a verified sequence's accepted drafts and the token after
        them; a bare token id stands for a list of one), and finish and free the sequences that stop; returns those."""
        lists = iter(emitted)
        finished = []
        per_token = any(batch.drafts)  # the decodes' states went to one slot per row (StepPlan.token_slots)
        for i, (seq, query_len, sample, drafts) in enumerate(
            zip(batch.seqs, batch.query_lens, batch.sample, batch.drafts)
        ):
            if not sample and seq.is_finished:
                continue
            if not sample:
                seq.num_computed_tokens += query_len
                self.block_manager.cache_computed(seq)
                continue
            tokens = next(lists)
            if seq.is_finished:  # aborted while its step was in the pipeline
                continue
            tokens = [tokens] if isinstance(tokens, int) else tokens
            if drafts:
                seq.spec_decode.add([len(drafts)], [tokens])
            seq.draft_token_ids, seq.draft_probs = [], None
            if per_token and i < batch.num_decode_seqs and seq.state_slot is not None:
                seq.state_column = len(tokens) - 1  # the state after the last accepted row
            computed = seq.num_computed_tokens + query_len - len(drafts) + len(tokens) - 1
            reason = None
            for token in tokens:
                seq.output_token_ids.append(token)
                reason = self._finish_reason(seq, token)
                if reason is not None:
                    break
            seq.num_computed_tokens = min(computed, seq.num_tokens - 1)
            if seq.sampling_params.logprobs is not None:  # tokens cut by a stop have none either
                del seq.output_logprobs[len(seq.output_token_ids) :]
            self.block_manager.cache_computed(seq)
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
