"""Rank 0's description of a drafting pass, as plain host data (broadcast under TP)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hetero.engine.runtime.batch import ScheduledBatch

__all__ = ["DraftPlan"]


@dataclass
class DraftPlan:
    """The first draft forward's rows and what each sequence drafts after it.

    Sequence b computes ``query_lens[b]`` rows ending at KV length ``seq_lens[b]`` over
    ``block_tables[b]``, from ``input_ids``; ``hidden_rows`` (hidden-state proposers) index the
    target step's rows each draft row reads. ``num_drafts[b]`` tokens are drafted from its last row
    (0: the rows only keep the draft's cache in step with the target's). ``greedy[b]``: argmax
    drafting, else sampled with the request's generator (rank 0 only).
    """

    input_ids: list[int] = field(default_factory=list)
    query_lens: list[int] = field(default_factory=list)
    seq_lens: list[int] = field(default_factory=list)
    block_tables: list[list[int]] = field(default_factory=list)
    hidden_rows: list[int] = field(default_factory=list)
    num_drafts: list[int] = field(default_factory=list)
    greedy: list[bool] = field(default_factory=list)

    @classmethod
    def of(cls, batch: ScheduledBatch, k: int, max_model_len: int, block_size: int, takes_hidden: bool):
        """The plan after ``batch`` ran and was postprocessed (rank 0).

        Per unfinished sequence of the batch, its rows this step that hold accepted tokens
        (``[start, num_computed_tokens)``); a token-fed draft model also computes the last token, which
        the target computes next step, and drafts from it, where a hidden-state proposer feeds each row
        the token after it and drafts from the last computed row. Drafts stop at ``max_model_len`` and
        at the sequence's blocks, so a draft never writes KV outside them.
        """
        plan = cls()
        row = 0
        for seq, q, length, sample in zip(batch.seqs, batch.query_lens, batch.seq_lens, batch.sample):
            start = length - q
            first_row, row = row, row + q
            if seq.is_finished:
                continue
            valid = seq.num_computed_tokens - start
            end = seq.num_computed_tokens + (0 if takes_hidden or not sample else 1)
            shift = 1 if takes_hidden else 0
            plan.input_ids.extend(seq.tokens(start + shift, end + shift))
            plan.query_lens.append(end - start)
            plan.seq_lens.append(end)
            plan.block_tables.append(list(seq.block_table))
            plan.hidden_rows.extend(range(first_row, first_row + valid) if takes_hidden else ())
            room = min(max_model_len, len(seq.block_table) * block_size) - (end - 1)
            plan.num_drafts.append(max(0, min(k, room)) if sample else 0)
            plan.greedy.append(seq.sampling_params.greedy)
        return plan
