"""Checks on what a caller hands ``LLM``: prompts, token ids and sampling parameters, each failure a UsageError."""
from __future__ import annotations

import numbers
import operator
from typing import Any

from hetero.engine.runtime.cache_io import SequenceCache
from hetero.engine.runtime.sequence import SamplingParams
from hetero.errors import UsageError

__all__ = ["token_ids", "check_params", "check_import", "prompt_list", "params_list"]


def token_ids(prompt: list[Any], vocab: int | None, index: int) -> list[int]:
    """``prompt`` as ints; UsageError naming the first bad ids (not integers, or outside the vocabulary)."""
    ids, bad = [], []
    for position, token in enumerate(prompt):
        try:
            value = None if isinstance(token, bool) else operator.index(token)
        except TypeError:
            value = None
        if value is None or value < 0 or (vocab is not None and value >= vocab):
            bad.append(f"{token!r} at position {position}")
        ids.append(value)
    if bad:
        raise UsageError(f"request {index}: argument 'prompt': token ids must be integers in [0, vocab_size={vocab}), "
                         f"got {', '.join(bad[:5])}" + (f" and {len(bad) - 5} more" if len(bad) > 5 else ""),
                         arg="prompt", expected=f"token ids in [0, {vocab})", got=bad[0])
    return ids


def check_params(params: Any, index: int) -> SamplingParams:
    if params is None:
        return SamplingParams()
    if not isinstance(params, SamplingParams):
        raise UsageError(f"request {index}: argument 'sampling_params': expected a SamplingParams, got "
                         f"{type(params).__name__}", arg="sampling_params", expected="a SamplingParams", got=params)
    return params


def prompt_list(prompts: Any) -> list[Any]:
    """One prompt (a string, or a flat list of numbers) or a list of them; their items are checked on admission."""
    if isinstance(prompts, str):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(p, numbers.Number) for p in prompts):
        return [prompts]
    return prompts


def params_list(params: Any, n: int) -> list[SamplingParams]:
    if params is None or isinstance(params, SamplingParams):
        return [params or SamplingParams()] * n
    params = list(params)
    if len(params) != n:
        raise UsageError(f"argument 'sampling_params': expected one, or one per prompt ({n}), got {len(params)}",
                         arg="sampling_params", expected=f"1 or {n}", got=len(params))
    return params


def check_import(cache: Any, prompt: list[int], index: int) -> None:
    """An imported cache must be a ``SequenceCache`` of fewer tokens than the prompt (one is left to compute),
    computed from the prompt's first tokens when it records them."""
    num_prompt_tokens = len(prompt)
    if not isinstance(cache, SequenceCache):
        raise UsageError(f"request {index}: argument 'cache': expected a SequenceCache, got {type(cache).__name__}",
                         arg="cache", expected="a SequenceCache", got=type(cache).__name__)
    if not 0 < cache.num_tokens < num_prompt_tokens:
        raise UsageError(f"request {index}: argument 'cache': a cache of {cache.num_tokens} tokens for a prompt of "
                         f"{num_prompt_tokens}; it must cover between 1 and {num_prompt_tokens - 1} tokens (the last "
                         f"prompt token is computed here)", arg="cache",
                         expected=f"1 to {num_prompt_tokens - 1} tokens", got=cache.num_tokens)
    if cache.token_ids is not None and list(cache.token_ids) != prompt[:cache.num_tokens]:
        at = next((i for i, (a, b) in enumerate(zip(cache.token_ids, prompt)) if a != b), len(cache.token_ids))
        raise UsageError(f"request {index}: argument 'cache': the cache was computed from other tokens than this "
                         f"prompt's (they differ at position {at}); a cache is only valid for the tokens it was "
                         f"computed from", arg="cache", expected="the prompt's first tokens",
                         got=f"token ids differing at position {at}")
