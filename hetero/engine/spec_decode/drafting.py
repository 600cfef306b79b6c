"""After each step, the next step's drafts: n-gram lookup on rank 0, or a draft model on every rank."""

from __future__ import annotations

from hetero.engine.runtime.batch import ScheduledBatch
from hetero.engine.spec_decode.config import SpeculativeConfig
from hetero.engine.spec_decode.ngram import propose_ngram

__all__ = ["Drafter"]


class Drafter:
    """Proposes ``draft_token_ids`` for the sequences a step sampled that are still running.

    ``lookahead``: KV positions past a sequence's tokens that drafting writes (the scheduler
    allocates them); 0 for n-gram, which reads token ids only. A model proposer
    (``hetero.engine.spec_decode.proposer``) is collective: every rank calls ``propose``.
    """

    def __init__(self, config: SpeculativeConfig, runner, lead: bool):
        self.config = config
        self.k = config.num_speculative_tokens
        self.lead = lead
        self.model = None
        if config.uses_model:
            from hetero.engine.spec_decode.proposer import ModelProposer

            self.model = ModelProposer(config, runner)
        self.lookahead = 0 if self.model is None else self.model.lookahead

    def propose(self, batch: ScheduledBatch | None) -> None:
        """Set the drafts of ``batch``'s sampled, unfinished sequences (rank 0's ``batch``; None elsewhere)."""
        if self.model is not None:
            self.model.propose(batch)
            return
        if batch is None:
            return
        c = self.config
        for seq in batch.sampled_seqs:
            if not seq.is_finished:
                seq.draft_token_ids = propose_ngram(seq.token_ids, self.k, c.prompt_lookup_min, c.prompt_lookup_max)
