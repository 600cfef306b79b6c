"""The host side of ``StepBuffers.fill`` (``hetero.engine.step_buffers``): checking a batch against
the buffers' capacities, and staging its per-row and per-sequence arrays with numpy.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["StepLimits", "check_batch", "stage_rows"]


class StepLimits(NamedTuple):
    """The capacities of a ``StepBuffers`` that a batch is checked against."""

    max_num_seqs: int
    max_num_tokens: int
    max_blocks: int
    block_size: int
    has_state: bool


def check_batch(
    limits: StepLimits, q: np.ndarray, s: np.ndarray, widths: np.ndarray, sample, state_slots, input_ids
) -> None:
    """Raise ValueError naming what of a ``StepBuffers.fill`` batch overflowed ``limits`` or does not match."""
    nb, nt = len(q), int(q.sum())
    counts = {
        "seq_lens": len(s),
        "block_tables": len(widths),
        "sample": None if sample is None else len(sample),
        "state_slots": None if state_slots is None else len(state_slots),
    }
    for name, n in counts.items():
        if n is not None and n != nb:
            raise ValueError(f"StepBuffers.fill: {name} has {n} entries for {nb} sequences")
    if nb > limits.max_num_seqs:
        raise ValueError(f"StepBuffers.fill: {nb} sequences exceed max_num_seqs={limits.max_num_seqs}")
    if nt > limits.max_num_tokens:
        raise ValueError(f"StepBuffers.fill: {nt} tokens exceed max_num_batched_tokens={limits.max_num_tokens}")
    if input_ids is not None and len(input_ids) != nt:
        raise ValueError(f"StepBuffers.fill: {len(input_ids)} input_ids for {nt} query rows")
    if state_slots is not None and not limits.has_state:
        raise ValueError("StepBuffers.fill: state_slots given, but the buffers were made without has_state")
    bad = np.flatnonzero((q < 0) | (s < q))
    if bad.size:
        b = int(bad[0])
        raise ValueError(
            f"StepBuffers.fill: sequence {b} has query length {q[b]} and seq_len {s[b]} (need 0 <= query <= seq_len)"
        )
    bad = np.flatnonzero(widths > limits.max_blocks)
    if bad.size:
        b = int(bad[0])
        raise ValueError(
            f"StepBuffers.fill: block table of sequence {b} has {widths[b]} blocks, more than "
            f"max_blocks={limits.max_blocks} (ceil(max_model_len / block_size))"
        )
    bad = np.flatnonzero(widths * limits.block_size < s)
    if bad.size:
        b = int(bad[0])
        raise ValueError(
            f"StepBuffers.fill: block table of sequence {b} has {widths[b]} blocks, too few for "
            f"seq_len {s[b]} with block size {limits.block_size}"
        )


def stage_rows(
    h: dict[str, np.ndarray], bs: int, q: np.ndarray, s: np.ndarray, starts: np.ndarray, sample, state_slots, input_ids
) -> dict[str, int]:
    """Stage the per-row and per-sequence arrays into the host staging ``h`` (block size ``bs``, its
    ``block_table`` already staged); return how many entries of each buffer are used."""
    nb, nt = len(q), int(starts[-1])
    owner = np.repeat(np.arange(nb), q)  # the sequence of each query row
    pos = np.arange(nt) - starts[owner] + (s - q)[owner]
    h["positions"][:nt] = pos
    h["slot_mapping"][:nt] = h["block_table"][owner, pos // bs].astype(np.int64) * bs + pos % bs
    h["query_start_loc"][: nb + 1] = starts
    h["seq_lens"][:nb] = s
    if sample is None:
        rows = starts[1:] - 1
    elif len(sample) and not isinstance(sample[0], (bool, np.bool_)):
        # a count of rows per sequence: its last c rows (a verified sequence's drafts and the row before)
        counts = np.asarray(sample, dtype=np.int64).reshape(-1)
        first = np.cumsum(counts) - counts
        within = np.arange(int(counts.sum())) - np.repeat(first, counts)
        rows = np.repeat(starts[1:] - counts, counts) + within
    else:
        rows = (starts[1:] - 1)[np.asarray(sample, dtype=bool).reshape(-1)]
    h["logits_indices"][: len(rows)] = rows
    used = {
        "positions": nt,
        "slot_mapping": nt,
        "query_start_loc": nb + 1,
        "seq_lens": nb,
        "block_table": nb,
        "logits_indices": len(rows),
    }
    if input_ids is not None:
        h["input_ids"][:nt] = input_ids
        used["input_ids"] = nt
    if state_slots is not None:
        h["state_slots"][:nb] = state_slots
        h["has_initial_state"][:nb] = s > q
        used.update(state_slots=nb, has_initial_state=nb)
    return used
