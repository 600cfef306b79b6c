"""A request in flight: its sampling parameters, its tokens and where its KV lives."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from hetero.engine.spec_decode.metrics import SpecDecodeStats
from hetero.errors import UsageError

__all__ = ["Logprob", "SamplingParams", "Sequence", "SequenceStatus"]


def _bad(name: str, expected: str, got: Any) -> UsageError:
    return UsageError(f"SamplingParams.{name} must be {expected}, got {got!r}", arg=name, expected=expected, got=got)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Logprob:
    """One token's log-probability at one position: log_softmax of the float32 logits before
    temperature, top-k and top-p; ``rank``: 1 + the number of tokens with a strictly larger logprob."""

    logprob: float
    rank: int


@dataclass(frozen=True)
class SamplingParams:
    """How one request's tokens are chosen and when it stops.

    - ``temperature``: 0 is greedy (argmax); values below 1e-5 count as 0.
    - ``top_k``: keep the k most likely tokens (0: off); ``top_p``: keep the smallest set
      of most likely tokens whose probability reaches p (1.0: off). Applied in that order,
      after the temperature.
    - ``max_tokens``: tokens to generate at most (finish reason "length"). A request also
      finishes with "length" when prompt and output reach the engine's ``max_model_len``;
      only a prompt longer than ``max_model_len`` is rejected.
    - ``seed``: this request's sampling seed; None derives one from the engine seed and the
      request's index.
    - ``ignore_eos``: keep going past EOS; ``stop_token_ids``: more tokens that finish the
      request (finish reason "stop"; the stop token is part of the output).
    - ``logprobs``: None (off), or k >= 0: each generated token's output entry maps the k
      most likely token ids and the sampled one (k or k + 1 entries) to their
      :class:`Logprob`, computed from the raw logits (before temperature, top-k, top-p), as
      vLLM's ``SamplingParams.logprobs``. k may not exceed the vocabulary (checked when added).

    Invalid values raise :class:`hetero.errors.UsageError` (a ValueError) naming the field.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_tokens: int = 16
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise _bad("temperature", "a finite number >= 0 (0 = greedy)", t)
        if not _is_int(self.top_k) or self.top_k < 0:
            raise _bad("top_k", "an integer >= 0 (0 = off)", self.top_k)
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise _bad("top_p", "a number in (0, 1]", p)
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise _bad("max_tokens", "an integer >= 1", self.max_tokens)
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < 2**63):
            raise _bad("seed", "an integer in [0, 2**63) or None", self.seed)
        if not isinstance(self.ignore_eos, bool):
            raise _bad("ignore_eos", "True or False", self.ignore_eos)
        ids = self.stop_token_ids
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            raise _bad("stop_token_ids", "a sequence of token ids", ids)
        ids = tuple(ids)
        if not all(_is_int(i) and i >= 0 for i in ids):
            raise _bad("stop_token_ids", "token ids (integers >= 0)", self.stop_token_ids)
        object.__setattr__(self, "stop_token_ids", ids)
        if self.logprobs is not None and (not _is_int(self.logprobs) or self.logprobs < 0):
            raise _bad("logprobs", "an integer >= 0 or None", self.logprobs)

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One request: prompt and output token ids, progress, and its KV blocks.

    ``num_computed_tokens`` counts the tokens whose KV is in the cache; the tokens after
    it are computed by later steps (the last generated token is always among them).
    ``block_table`` lists its KV block ids in order; ``block_hashes`` the prefix-cache
    hashes of its first full, computed blocks (kept by the BlockManager).
    ``index`` is the request's arrival number (the default sampling seed derives from it).
    ``state_slot`` is its slot in the state pool while it runs (models with per-sequence
    state only; under speculative decoding the first of its group of 1 + k slots, its state in
    slot ``state_slot + state_column``: the column of the last accepted token's state);
    ``imported`` an exported cache (``cache_io.SequenceCache``) to start from, written into its
    blocks when it is admitted. ``num_streamed`` counts the output tokens
    already reported by ``LLM.step``; ``output_logprobs`` one entry per output token when
    its parameters ask for logprobs (appended by rank 0's ``ModelRunner``), else stays empty.
    Speculative decoding: ``draft_token_ids`` are the tokens proposed for the next step (and
    ``draft_probs`` the draft's float32 distributions [k, V] at them, when a model drafted by
    sampling); ``spec_decode`` counts its verified drafts (a ``SpecDecodeStats``).
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    index: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    state_slot: int | None = None
    state_column: int = 0
    imported: Any = field(default=None, repr=False)
    finish_reason: str | None = None
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    num_streamed: int = 0
    generator: torch.Generator | None = field(default=None, repr=False)
    metrics: dict[str, float] = field(default_factory=dict)
    output_logprobs: list[dict[int, Logprob]] = field(default_factory=list, repr=False)
    draft_token_ids: list[int] = field(default_factory=list)
    draft_probs: Any = field(default=None, repr=False)
    spec_decode: SpecDecodeStats = field(default_factory=SpecDecodeStats, repr=False)

    def __post_init__(self) -> None:
        self.prompt_token_ids = list(self.prompt_token_ids)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def tokens(self, start: int, end: int) -> list[int]:
        """Token ids at positions ``[start, end)`` (prompt first, then output), without copying the rest."""
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n]
