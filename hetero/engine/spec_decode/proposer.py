"""Drafting with a model: a separate draft checkpoint, the target's own MTP layers, or an EAGLE-3 head.

The draft has its own paged cache over the target's block ids (the scheduler allocates the positions
it writes), its own step buffers, and runs after every target step on every rank: first over the rows
the target accepted (so its cache follows the target's), then one row per further draft token.
"""

from __future__ import annotations

import torch

from hetero.engine.runtime.batch import ScheduledBatch
from hetero.engine.runtime.kv_cache import allocate_kv_cache
from hetero.engine.runtime.sampler import Sampler
from hetero.engine.spec_decode.config import SpeculativeConfig
from hetero.engine.spec_decode.draft_plan import DraftPlan
from hetero.engine.step_buffers import StepBuffers

__all__ = ["ModelProposer"]


class ModelProposer:
    """Drafts ``num_speculative_tokens`` per request with ``runner.draft`` (built by the runner, whose KV
    budget counts the draft's cache). ``lookahead``: positions past a sequence's tokens it writes."""

    def __init__(self, config: SpeculativeConfig, runner):
        self.k = config.num_speculative_tokens
        self.runner = runner
        self.draft = runner.draft
        self.takes_hidden = self.draft.takes_hidden
        self.lookahead = self.k - 1 if self.takes_hidden else self.k
        c = runner.config
        with torch.no_grad():
            self.cache = allocate_kv_cache(self.draft, runner.num_kv_blocks, c.block_size, runner.dtype, runner.device)
        rows = c.max_num_batched_tokens + c.max_num_seqs
        self.buffers = StepBuffers(rows, c.max_num_seqs, c.max_model_len, c.block_size, runner.device)
        if self.takes_hidden and self.draft.aux_layers:
            runner.capture_layers = True

    def propose(self, batch: ScheduledBatch | None) -> None:
        """Collective: rank 0 passes its postprocessed batch (others None); sets rank 0's drafts."""
        runner, lead = self.runner, self.runner.rank == 0
        c = runner.config
        plan = DraftPlan.of(batch, self.k, c.max_model_len, c.block_size, self.takes_hidden) if lead else None
        plan = runner.parallel.broadcast_object(plan, runner.device)
        if not plan.query_lens:
            return
        running = [s for s in batch.seqs if not s.is_finished] if lead else None  # DraftPlan's sequences, in order
        with torch.inference_mode():
            drafts, probs = self._run(plan, running)
        if lead:
            for seq, tokens, q in zip(running, drafts, probs):
                seq.draft_token_ids, seq.draft_probs = tokens, q

    def _run(self, plan: DraftPlan, seqs) -> tuple[list[list[int]], list]:
        runner, dev = self.runner, self.runner.device
        want = plan.num_drafts
        hidden_in = None
        if self.takes_hidden:
            rows = torch.tensor(plan.hidden_rows, dtype=torch.int64, device=dev)
            hidden_in = self.draft.target_hidden(runner.last_hidden, runner.last_captured, rows)
        step, ids = self.buffers.fill(
            plan.query_lens, plan.seq_lens, plan.block_tables, [k > 0 for k in want], None, plan.input_ids
        )
        hidden = self.draft(ids, step, hidden_in)
        live = [b for b, k in enumerate(want) if k > 0]
        drafts: list[list[int]] = [[] for _ in want]
        probs: list[list[torch.Tensor] | None] = [None] * len(want)
        if not live:
            return drafts, probs
        last = hidden[step.logits_indices]
        positions = [plan.seq_lens[b] for b in live]  # the next row of each drafting sequence
        for j in range(max(want)):
            if j:
                live_j = [i for i, b in enumerate(live) if want[b] > j]
                if not live_j:
                    break
                sel = torch.tensor(live_j, dtype=torch.int64, device=dev)
                tokens = [drafts[live[i]][-1] for i in live_j]
                lens = [positions[i] + j for i in live_j]
                step, ids = self.buffers.fill(
                    [1] * len(live_j), lens, [plan.block_tables[live[i]] for i in live_j], None, None, tokens
                )
                last = self.draft(ids, step, last[sel] if self.takes_hidden else None)
                live, positions = [live[i] for i in live_j], [positions[i] for i in live_j]
            chosen = self._choose(self.draft.compute_logits(last), live, plan, seqs, probs)
            for b, t in zip(live, chosen):
                drafts[b].append(t)
        return drafts, [torch.stack(p) if p else None for p in probs]

    def _choose(self, logits, live, plan, seqs, probs) -> list[int]:
        """Rank 0 picks each live sequence's next draft (argmax, or a sample it keeps the distribution of)."""
        runner = self.runner
        if runner.rank == 0:
            out = logits.max(dim=-1).indices
            rows = [i for i, b in enumerate(live) if not plan.greedy[b]]
            if rows:
                picked = [seqs[live[i]] for i in rows]
                q_all = Sampler.probabilities(logits[rows], [s.sampling_params for s in picked])
                for j, (i, seq) in enumerate(zip(rows, picked)):
                    if seq.generator is None:
                        seq.generator = runner.sampler.generator(seq.sampling_params, seq.index, logits.device)
                    out[i] = torch.multinomial(q_all[j], 1, generator=seq.generator)[0]
                    probs[live[i]] = (probs[live[i]] or []) + [q_all[j]]
            chosen = out.to(torch.int64)
        else:
            chosen = torch.empty(len(live), dtype=torch.int64, device=runner.device)
        return runner.parallel.broadcast(chosen, 0).tolist()
