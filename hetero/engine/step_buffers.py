"""Persistent buffers for the tensors of an engine step, allocated once from the engine's limits.

A CUDA graph replays kernels on fixed addresses, so the tensors a step hands the model
(``Step``) must live at the same place every step: ``StepBuffers`` allocates them once,
sized by the limits of the engine, and ``fill`` writes each step's host data into them and
returns a ``Step`` made of views. The host arrays are built with numpy in (pinned, for CUDA)
staging memory and copied in one ``copy_`` per buffer, so a step costs a few copies
instead of a dozen tensor constructions (the batch checks and the numpy staging of the
per-row arrays are in ``hetero.engine._step_staging``).

The one buffer that is not fixed is ``kv_slots`` (the cache slot of every KV position of
the prefill sequences): its size is bounded by the sum of their lengths, not by a small
limit, so it grows (is reallocated, at least doubling) when a step needs more than it holds.
Only prefill steps use it; the decode steps a graph captures never do.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from hetero.engine._step_staging import StepLimits, check_batch, stage_rows
from hetero.engine.step import PrefillSpan, Step
from hetero.spec.types import AttentionMeta

__all__ = ["StepBuffers", "build_step"]


class StepBuffers:
    """Device buffers for the steps of one engine, written by ``fill``.

    Capacities: ``max_num_tokens`` query rows (``max_num_batched_tokens``), ``max_num_seqs``
    sequences, ``max_blocks = ceil(max_model_len / block_size)`` block-table columns per
    sequence. ``has_state``: the model keeps per-sequence state (``state_slots`` /
    ``has_initial_state`` are allocated). ``kv_slots_capacity``: the initial size of the
    growing ``kv_slots`` buffer (default ``max_num_tokens``).

    The persistent device tensors are attributes: ``input_ids``, ``positions``,
    ``slot_mapping`` [max_num_tokens]; ``query_start_loc``, ``cu_seqlens_q``,
    ``cu_seqlens_k`` int32 [max_num_seqs+1]; ``seq_lens`` int32 [max_num_seqs];
    ``block_table`` int32 [max_num_seqs, max_blocks]; ``logits_indices`` [max(max_num_seqs, max_num_tokens)];
    ``state_slots``, ``has_initial_state`` [max_num_seqs] (None without state); ``kv_slots``.

    A ``Step`` returned by ``fill`` is valid until the next ``fill``, which overwrites it.
    """

    def __init__(
        self,
        max_num_tokens: int,
        max_num_seqs: int,
        max_model_len: int,
        block_size: int,
        device: torch.device | str,
        *,
        has_state: bool = False,
        kv_slots_capacity: int | None = None,
    ):
        for name, value, least in (
            ("max_num_tokens", max_num_tokens, 0),
            ("max_num_seqs", max_num_seqs, 0),
            ("max_model_len", max_model_len, 0),
            ("block_size", block_size, 1),
        ):
            if int(value) < least:
                raise ValueError(f"StepBuffers: {name} must be >= {least}, got {value}")
        self.max_num_tokens, self.max_num_seqs = int(max_num_tokens), int(max_num_seqs)
        self.block_size = int(block_size)
        self.max_blocks = -(-int(max_model_len) // self.block_size)
        self.device = torch.device(device)
        self.has_state = bool(has_state)
        self._limits = StepLimits(
            self.max_num_seqs, self.max_num_tokens, self.max_blocks, self.block_size, self.has_state
        )
        # pinned staging makes the host-to-device copies asynchronous; an event keeps the next
        # fill from overwriting the staging before the copies that read it have run
        self._pinned = self.device.type == "cuda"
        self._copied = torch.cuda.Event() if self._pinned else None
        self._pending = False
        self._dev: dict[str, torch.Tensor] = {}
        self._host: dict[str, np.ndarray] = {}
        t, b, i32, i64 = self.max_num_tokens, self.max_num_seqs, torch.int32, torch.int64
        shapes = {
            "input_ids": ((t,), i64),
            "positions": ((t,), i64),
            "slot_mapping": ((t,), i64),
            "query_start_loc": ((b + 1,), i32),
            "seq_lens": ((b,), i32),
            "block_table": ((b, self.max_blocks), i32),
            "logits_indices": ((max(b, t),), i64),
            "cu_seqlens_q": ((b + 1,), i32),
            "cu_seqlens_k": ((b + 1,), i32),
            "kv_slots": ((t if kv_slots_capacity is None else int(kv_slots_capacity),), i64),
        }
        if self.has_state:
            shapes.update(state_slots=((b,), i32), has_initial_state=((b,), torch.bool))
        for name, (shape, dtype) in shapes.items():
            self._alloc(name, shape, dtype)
        if not self.has_state:
            self.state_slots = self.has_initial_state = None

    def _alloc(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        """A zeroed device buffer and its host staging (the buffer itself on the CPU: no copy)."""
        dev = torch.zeros(shape, dtype=dtype, device=self.device)
        host = dev if self.device.type == "cpu" else torch.zeros(shape, dtype=dtype, pin_memory=self._pinned)
        self._dev[name], self._host[name] = dev, host.numpy()
        setattr(self, name, dev)

    # -- fill --------------------------------------------------------------------------
    def fill(
        self,
        query_lens: Sequence[int],
        seq_lens: Sequence[int],
        block_tables: Sequence[Sequence[int]],
        sample: Sequence[bool] | None = None,
        state_slots: Sequence[int] | None = None,
        input_ids: Sequence[int] | None = None,
    ) -> tuple[Step, torch.Tensor | None]:
        """Write one step into the buffers; return its ``Step`` (views) and the ``input_ids`` view.

        Same arguments and semantics as ``build_step``: sequences with one query row come
        first; ``sample[b]`` says whether sequence b's last row is sampled (default: all), or
        (integers) how many of its last rows are (speculative decoding verifies several);
        ``state_slots[b]`` is its state slot (requires ``has_state``); ``input_ids`` are the
        T query tokens (the second result is None without them). Block-table padding is 0.
        Raises ValueError when the batch exceeds a capacity or is inconsistent.
        """
        q = np.asarray(query_lens, dtype=np.int64).reshape(-1)
        s = np.asarray(seq_lens, dtype=np.int64).reshape(-1)
        widths = np.fromiter((len(r) for r in block_tables), dtype=np.int64, count=len(block_tables))
        check_batch(self._limits, q, s, widths, sample, state_slots, input_ids)
        if self._pending:
            self._copied.synchronize()
        table = self._host["block_table"][: len(q)]
        table[...] = 0  # rows of an earlier, wider batch must not leak into the padding
        for b, row in enumerate(block_tables):
            table[b, : widths[b]] = row
        starts = np.zeros(len(q) + 1, dtype=np.int64)
        np.cumsum(q, out=starts[1:])
        used = stage_rows(self._host, self.block_size, q, s, starts, sample, state_slots, input_ids)
        ones = q == 1
        num_decodes = len(q) if ones.all() else int(ones.argmin())
        prefill = self._prefill(q, s, starts, num_decodes, used)
        self._upload(used)
        return self._step(q, s, num_decodes, prefill, used), self._view("input_ids", used)

    def _prefill(
        self, q: np.ndarray, s: np.ndarray, starts: np.ndarray, first: int, used: dict[str, int]
    ) -> PrefillSpan | None:
        """Stage the prefill sequences [first, B) as a PrefillSpan (None when there are none)."""
        nb, h, bs = len(q), self._host, self.block_size
        if first == nb:
            return None
        kv_lens = s[first:]
        cu_k = np.zeros(nb - first + 1, dtype=np.int64)
        np.cumsum(kv_lens, out=cu_k[1:])
        total = int(cu_k[-1])
        self._reserve_kv_slots(total)
        owner = np.repeat(np.arange(first, nb), kv_lens)  # the sequence of each KV position
        kpos = np.arange(total) - cu_k[owner - first]
        h["kv_slots"][:total] = h["block_table"][owner, kpos // bs].astype(np.int64) * bs + kpos % bs
        h["cu_seqlens_q"][: nb - first + 1] = starts[first:] - starts[first]
        h["cu_seqlens_k"][: nb - first + 1] = cu_k
        used.update(kv_slots=total, cu_seqlens_q=nb - first + 1, cu_seqlens_k=nb - first + 1)
        return PrefillSpan(
            first_seq=first,
            first_token=int(starts[first]),
            cu_seqlens_q=self._view("cu_seqlens_q", used),
            cu_seqlens_k=self._view("cu_seqlens_k", used),
            max_seqlen_q=int(q[first:].max()),
            max_seqlen_k=int(kv_lens.max()),
            kv_slots=self._view("kv_slots", used),
        )

    def _reserve_kv_slots(self, needed: int) -> None:
        """Grow ``kv_slots`` (a new buffer, at least doubled) when a step's prefill needs more."""
        have = self._dev["kv_slots"].shape[0]
        if needed > have:
            self._alloc("kv_slots", (max(needed, 2 * have),), torch.int64)

    def _upload(self, used: dict[str, int]) -> None:
        """Copy each staged prefix into its device buffer (nothing to do on the CPU)."""
        if self.device.type == "cpu":
            return
        for name, n in used.items():
            self._dev[name][:n].copy_(torch.from_numpy(self._host[name][:n]), non_blocking=self._pinned)
        if self._pinned:
            self._copied.record(torch.cuda.current_stream(self.device))
            self._pending = True

    def _view(self, name: str, used: dict[str, int]) -> torch.Tensor | None:
        return self._dev[name][: used[name]] if name in used else None

    def _step(
        self, q: np.ndarray, s: np.ndarray, num_decodes: int, prefill: PrefillSpan | None, used: dict[str, int]
    ) -> Step:
        """The Step of views over what ``fill`` staged."""
        nb = len(q)
        qsl, lens, table = (self._dev[n] for n in ("query_start_loc", "seq_lens", "block_table"))
        meta = AttentionMeta(
            query_start_loc=qsl[: nb + 1],
            seq_lens=lens[:nb],
            block_table=table[:nb],
            max_query_len=int(q.max(initial=0)),
            max_seq_len=int(s.max(initial=0)),
        )
        decode_meta = None
        if num_decodes:
            decode_meta = AttentionMeta(
                query_start_loc=qsl[: num_decodes + 1],
                seq_lens=lens[:num_decodes],
                block_table=table[:num_decodes],
                max_query_len=1,
                max_seq_len=int(s[:num_decodes].max()),
            )
        return Step(
            positions=self._view("positions", used),
            slot_mapping=self._view("slot_mapping", used),
            meta=meta,
            num_decodes=num_decodes,
            decode_meta=decode_meta,
            prefill=prefill,
            logits_indices=self._view("logits_indices", used),
            state_slots=self._view("state_slots", used),
            has_initial_state=self._view("has_initial_state", used),
        )


def build_step(
    query_lens: Sequence[int],
    seq_lens: Sequence[int],
    block_tables: Sequence[Sequence[int]],
    block_size: int,
    device: torch.device | str,
    sample: Sequence[bool] | None = None,
    state_slots: Sequence[int] | None = None,
) -> Step:
    """Build a step from host lists. Sequences with one query row must come first.

    ``sample[b]``: whether sequence b's last row is sampled (default: all);
    ``state_slots[b]``: its state slot (models with per-sequence state). The block
    table is padded with 0 to the longest row. This goes through ``StepBuffers``
    sized to this one batch, the code path of the engine's persistent buffers.
    """
    width = max((len(b) for b in block_tables), default=0)
    buffers = StepBuffers(
        sum(query_lens),
        len(query_lens),
        width * block_size,
        block_size,
        device,
        has_state=state_slots is not None,
        kv_slots_capacity=0,
    )
    step, _ = buffers.fill(query_lens, seq_lens, block_tables, sample=sample, state_slots=state_slots)
    return step
