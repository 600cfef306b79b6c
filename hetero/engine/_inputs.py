"""Checks on what a caller hands ``LLM``: prompts, token ids and sampling parameters, each failure a UsageError."""

from __future__ import annotations

import numbers
import operator
from typing import Any, Sequence

from hetero.engine._setup import TOKENIZER_FILES
from hetero.engine.config import EngineConfig, media_token_ids, text_config
from hetero.engine.runtime.cache_io import SequenceCache
from hetero.engine.runtime.sequence import SamplingParams
from hetero.errors import UsageError

__all__ = ["token_ids", "check_params", "check_logprobs", "check_import", "encode_prompt", "prompt_list", "params_list"]


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
        raise UsageError(
            f"request {index}: argument 'prompt': token ids must be integers in [0, vocab_size={vocab}), "
            f"got {', '.join(bad[:5])}" + (f" and {len(bad) - 5} more" if len(bad) > 5 else ""),
            arg="prompt",
            expected=f"token ids in [0, {vocab})",
            got=bad[0],
        )
    return ids


def check_params(params: Any, index: int) -> SamplingParams:
    if params is None:
        return SamplingParams()
    if not isinstance(params, SamplingParams):
        raise UsageError(
            f"request {index}: argument 'sampling_params': expected a SamplingParams, got {type(params).__name__}",
            arg="sampling_params",
            expected="a SamplingParams",
            got=params,
        )
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
        raise UsageError(
            f"argument 'sampling_params': expected one, or one per prompt ({n}), got {len(params)}",
            arg="sampling_params",
            expected=f"1 or {n}",
            got=len(params),
        )
    return params


def check_import(cache: Any, prompt: list[int], index: int) -> None:
    """An imported cache must be a ``SequenceCache`` of fewer tokens than the prompt (one is left to compute),
    computed from the prompt's first tokens when it records them."""
    num_prompt_tokens = len(prompt)
    if not isinstance(cache, SequenceCache):
        raise UsageError(
            f"request {index}: argument 'cache': expected a SequenceCache, got {type(cache).__name__}",
            arg="cache",
            expected="a SequenceCache",
            got=type(cache).__name__,
        )
    if not 0 < cache.num_tokens < num_prompt_tokens:
        raise UsageError(
            f"request {index}: argument 'cache': a cache of {cache.num_tokens} tokens for a prompt of "
            f"{num_prompt_tokens}; it must cover between 1 and {num_prompt_tokens - 1} tokens (the last "
            f"prompt token is computed here)",
            arg="cache",
            expected=f"1 to {num_prompt_tokens - 1} tokens",
            got=cache.num_tokens,
        )
    if cache.token_ids is not None and list(cache.token_ids) != prompt[: cache.num_tokens]:
        at = next((i for i, (a, b) in enumerate(zip(cache.token_ids, prompt)) if a != b), len(cache.token_ids))
        raise UsageError(
            f"request {index}: argument 'cache': the cache was computed from other tokens than this "
            f"prompt's (they differ at position {at}); a cache is only valid for the tokens it was "
            f"computed from",
            arg="cache",
            expected="the prompt's first tokens",
            got=f"token ids differing at position {at}",
        )


def check_logprobs(params: SamplingParams, vocab: int | None, index: int) -> None:
    """UsageError unless ``params.logprobs`` is at most the vocabulary size (when the config names one)."""
    if params.logprobs is not None and vocab is not None and params.logprobs > vocab:
        raise UsageError(
            f"request {index}: argument 'sampling_params': SamplingParams.logprobs must be at most the "
            f"vocabulary size {vocab}, got {params.logprobs}",
            arg="logprobs",
            expected=f"an integer in [0, {vocab}]",
            got=params.logprobs,
        )


def encode_prompt(prompt: str | Sequence[int], tokenizer: Any, config: EngineConfig, index: int) -> list[int]:
    """The token ids of request ``index``'s prompt: text through ``tokenizer``, ids checked by ``token_ids``."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise UsageError(
                f"request {index}: argument 'prompt': prompt {prompt[:40]!r} is text, but "
                f"{config.model} has no tokenizer files ({', '.join(TOKENIZER_FILES)}); "
                f"pass token ids instead",
                arg="prompt",
                expected="token ids",
                got=prompt[:40],
            )
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate: the tokenizer would fail with a TypeError
            raise UsageError(
                f"request {index}: argument 'prompt': not valid Unicode ({e.reason} at position {e.start})",
                arg="prompt",
                expected="a valid Unicode string",
                got=prompt[max(0, e.start - 10) : e.start + 10],
            ) from None
        return _no_media(list(tokenizer.encode(prompt)), config.hf_config, index)
    if not hasattr(prompt, "__iter__"):
        raise UsageError(
            f"request {index}: argument 'prompt': expected a string or a list of token ids, got {prompt!r:.60}",
            arg="prompt",
            expected="a string or token ids",
            got=prompt,
        )
    vocab = getattr(text_config(config.hf_config), "vocab_size", None)
    return _no_media(token_ids(list(prompt), vocab, index), config.hf_config, index)


def _no_media(ids: list[int], hf_config: Any, index: int) -> list[int]:
    """``ids``, unless a multimodal checkpoint's image or video placeholder is among them: hetero runs the
    text model of such a checkpoint, and a placeholder without its pixels would be read as a plain token."""
    media = media_token_ids(hf_config)
    if not media:
        return ids
    model = (getattr(hf_config, "architectures", None) or ["this checkpoint"])[0]
    for position, token in enumerate(ids):
        if token in media:
            raise UsageError(
                f"request {index}: argument 'prompt': token {token} at position {position} is {model}'s "
                f"{media[token]} placeholder; hetero runs {model}'s text model only (no image or video inputs)",
                arg="prompt",
                expected="text tokens only",
                got=f"{media[token]} {token}",
            )
    return ids
