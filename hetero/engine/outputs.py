"""What ``LLM`` hands back per request: the tokens so far, what is new since the last report, and how it ended."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hetero.engine.runtime.sequence import Logprob, Sequence

__all__ = ["RequestOutput", "request_output"]


@dataclass
class RequestOutput:
    """One request's progress after a step, or its end.

    ``token_ids``: every generated token so far; ``new_token_ids``: those generated since
    this request was last reported (a streaming client appends them). ``finish_reason``:
    None while it runs, then "stop", "length" or "abort". ``text`` (the decoded output) is
    set once it finishes, when the engine has a tokenizer.

    ``metrics``: ``arrival_time``, ``first_token_time``, ``finish_time`` (``time.perf_counter``
    seconds; the last once finished), ``num_prompt_tokens``, ``num_cached_tokens`` (prompt
    tokens found in the prefix cache or imported) and ``num_preemptions``; with speculative decoding,
    once it verified drafts, ``spec_decode``: ``{num_draft_tokens, num_accepted_tokens}``.

    ``logprobs``: None unless the request's ``SamplingParams.logprobs`` is set; then one dict
    ``{token_id: Logprob}`` per entry of ``token_ids`` (its top-k and the sampled token, in
    rank order), and ``new_logprobs`` the entries of ``new_token_ids``.
    """

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str | None
    finish_reason: str | None
    metrics: dict[str, float] = field(default_factory=dict)
    new_token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] | None = None
    new_logprobs: list[dict[int, Logprob]] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def request_output(seq: Sequence, now: float, tokenizer: Any) -> RequestOutput:
    """``seq``'s output now; the tokens it reports as new are marked streamed."""
    streamed, seq.num_streamed = seq.num_streamed, len(seq.output_token_ids)
    seq.metrics.update(
        num_prompt_tokens=seq.num_prompt_tokens,
        num_cached_tokens=seq.num_cached_tokens,
        num_preemptions=seq.num_preemptions,
    )
    if seq.spec_decode.num_drafts:
        seq.metrics["spec_decode"] = {
            "num_draft_tokens": seq.spec_decode.num_draft_tokens,
            "num_accepted_tokens": seq.spec_decode.num_accepted_tokens,
        }
    text = None
    if seq.finish_reason is not None:
        seq.metrics["finish_time"] = now
        if tokenizer is not None:
            text = tokenizer.decode(seq.output_token_ids, skip_special_tokens=True)
    logprobs = list(seq.output_logprobs) if seq.sampling_params.logprobs is not None else None
    return RequestOutput(
        seq.request_id,
        list(seq.prompt_token_ids),
        list(seq.output_token_ids),
        text,
        seq.finish_reason,
        dict(seq.metrics),
        seq.output_token_ids[streamed:],
        logprobs,
        logprobs[streamed:] if logprobs is not None else None,
    )
