"""Speculative decoding's counters, per engine (``LLM.stats["spec_decode"]``) and per request."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["SpecDecodeStats"]


@dataclass
class SpecDecodeStats:
    """Counts since the engine started, over every verified draft.

    ``num_drafts``: verifications (a request with at least one draft token in a step);
    ``num_draft_tokens`` / ``num_accepted_tokens``: draft tokens verified and accepted;
    ``accepted_per_position[j]``: drafts whose position j was accepted; ``drafted_per_position[j]``:
    drafts that had a position j. The rates follow vLLM's definitions.
    """

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)

    def copy(self) -> "SpecDecodeStats":
        return SpecDecodeStats(
            self.num_drafts,
            self.num_draft_tokens,
            self.num_accepted_tokens,
            list(self.accepted_per_position),
            list(self.drafted_per_position),
        )

    def __sub__(self, earlier: "SpecDecodeStats") -> "SpecDecodeStats":
        """The counts since ``earlier`` (a ``copy()`` taken before)."""

        def minus(now: list[int], then: list[int]) -> list[int]:
            return [a - (then[i] if i < len(then) else 0) for i, a in enumerate(now)]

        return SpecDecodeStats(
            self.num_drafts - earlier.num_drafts,
            self.num_draft_tokens - earlier.num_draft_tokens,
            self.num_accepted_tokens - earlier.num_accepted_tokens,
            minus(self.accepted_per_position, earlier.accepted_per_position),
            minus(self.drafted_per_position, earlier.drafted_per_position),
        )

    def add(self, spec_lens: list[int], emitted: list[list[int]]) -> None:
        """Count one step: per sampled sequence its number of drafts and its emitted tokens."""
        for k, tokens in zip(spec_lens, emitted):
            if not k:
                continue
            accepted = len(tokens) - 1
            self.num_drafts += 1
            self.num_draft_tokens += k
            self.num_accepted_tokens += accepted
            for per, n in ((self.drafted_per_position, k), (self.accepted_per_position, accepted)):
                per.extend([0] * (k - len(per)))
                for j in range(n):
                    per[j] += 1

    @property
    def acceptance_rate(self) -> float:
        """Accepted over drafted tokens (0 before any draft)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per verification: 1 + accepted drafts per draft (1 before any draft)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    def as_dict(self) -> dict[str, Any]:
        per_pos = [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)]
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
            "acceptance_rate_per_position": per_pos,
        }
