"""Requests are checked when they are admitted, before any op runs: a malformed one raises a UsageError
naming the request index, the argument, what was expected and what came, and leaves the engine idle."""

from __future__ import annotations

import re

import pytest

from hetero.engine import LLM, SamplingParams
from hetero.errors import UsageError

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(checkpoints) -> LLM:
    """cpu_ref, float32; the tiny qwen3 has vocab_size 256 and max_position_embeddings 512."""
    return LLM(str(checkpoints("qwen3")), backend="cpu_ref", dtype="float32", block_size=8)


@pytest.fixture
def no_ops(checkpoints, monkeypatch):
    """A fresh engine (request indices from 0) on which any step that reaches the model runner fails the test."""

    def run(batch):
        raise AssertionError("an op ran for a request that should have been refused")

    fresh = LLM(str(checkpoints("qwen3")), backend="cpu_ref", dtype="float32", block_size=8)
    monkeypatch.setattr(fresh.runner, "run", run)
    return fresh


@pytest.mark.parametrize(
    "prompts, message",
    [
        (
            [[1, 256]],
            "request 0: argument 'prompt': token ids must be integers in [0, vocab_size=256), got 256 at position 1",
        ),
        ([[1, -1]], "got -1 at position 1"),
        ([1, 2.5], "got 2.5 at position 1"),
        ([[1, True]], "got True at position 1"),
        ([[1, "2"]], "got '2' at position 1"),
        (
            [[5, 6], [7, 8, 999, 1000]],
            "request 1: argument 'prompt': token ids must be integers in [0, vocab_size=256), "
            "got 999 at position 2, 1000 at position 3",
        ),
        ([[5, 6], []], "request 1: argument 'prompt': expected at least one token, got an empty prompt"),
        ([[5, 6], [7] * 513], "request 1: argument 'prompt': prompt of 513 tokens is longer than max_model_len (512)"),
        ([[5, 6], None], "request 1: argument 'prompt': expected a string or a list of token ids, got None"),
        ([[5, 6], "ab\ud800c"], "request 1: argument 'prompt': not valid Unicode (surrogates not allowed"),
    ],
)
def test_malformed_prompts_are_refused_before_any_op(no_ops, prompts, message):
    with pytest.raises(UsageError, match=re.escape(message)) as err:
        no_ops.generate(prompts, GREEDY, progress=False)
    assert isinstance(err.value, ValueError) and err.value.arg == "prompt"
    assert not no_ops.has_unfinished(), "a refused batch leaves nothing behind"


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("temperature", -0.5, "a finite number >= 0 (0 = greedy)"),
        ("temperature", float("nan"), "a finite number >= 0 (0 = greedy)"),
        ("top_p", 0.0, "a number in (0, 1]"),
        ("top_p", 1.5, "a number in (0, 1]"),
        ("top_k", -1, "an integer >= 0 (0 = off)"),
        ("max_tokens", 0, "an integer >= 1"),
        ("max_tokens", -2, "an integer >= 1"),
    ],
)
def test_invalid_sampling_params_are_usage_errors(field, value, expected):
    with pytest.raises(UsageError, match=re.escape(f"SamplingParams.{field} must be {expected}, got {value!r}")) as err:
        SamplingParams(**{field: value})
    assert (err.value.arg, err.value.expected) == (field, expected)


def test_sampling_params_of_the_wrong_kind_or_count(no_ops):
    with pytest.raises(UsageError, match=r"request 0: argument 'sampling_params': expected a SamplingParams, got dict"):
        no_ops.add_request([1, 2], {"max_tokens": 3})
    with pytest.raises(UsageError, match=r"argument 'sampling_params': expected one, or one per prompt \(2\), got 3"):
        no_ops.generate([[1], [2]], [GREEDY] * 3, progress=False)
    assert not no_ops.has_unfinished()


def test_a_request_the_kv_cache_can_never_hold(checkpoints, monkeypatch):
    small = LLM(str(checkpoints("qwen3")), backend="cpu_ref", dtype="float32", block_size=8, num_kv_blocks=2)
    monkeypatch.setattr(small.runner, "run", lambda batch: pytest.fail("an op ran"))
    params = SamplingParams(temperature=0.0, max_tokens=20)
    with pytest.raises(
        UsageError, match=r"request 0: prompt of 10 tokens with max_tokens=20 needs 4 KV blocks .* has 2"
    ):
        small.generate([[1] * 10], params, progress=False)
    assert not small.has_unfinished()


def test_a_prompt_near_max_model_len_stops_there(engine):
    """Prompt and max_tokens beyond max_model_len are accepted: the output stops at max_model_len tokens."""
    out = engine.generate([[7] * 510], SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True), progress=False)[
        0
    ]
    assert (len(out.token_ids), out.finish_reason) == (2, "length")


def test_the_engine_still_serves_after_refusals(engine):
    """A refused batch takes no request index: the next batch's ids (and default seeds) are as without it."""
    before = int(engine.generate([[9]], GREEDY, progress=False)[0].request_id)
    prompt_tokens = engine.stats["prompt_tokens"]
    with pytest.raises(UsageError, match=f"request {before + 2}: "):
        engine.generate([[1, 2], [3, 300]], GREEDY, progress=False)
    assert engine.stats["prompt_tokens"] == prompt_tokens
    outs = engine.generate([[1, 2], [3, 4]], GREEDY, progress=False)
    assert [(int(o.request_id), len(o.token_ids)) for o in outs] == [(before + 1, 4), (before + 2, 4)]
    assert engine.add_request([5, 6], GREEDY, request_id="mine") == "mine"
    with pytest.raises(UsageError, match=rf"request {before + 4} \(id 'x'\): argument 'prompt': expected at least one"):
        engine.add_request([], GREEDY, request_id="x")
    while engine.has_unfinished():
        engine.step()
