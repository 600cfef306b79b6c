"""``hetero bench-serve --dataset-name multi-turn`` against an in-process ``hetero serve`` of the tiny Qwen3 (its
char-level tokenizer), in both formats: every round's prompt is the previous round's prompt, its answer (token ids, or
text) and a new question; users share the system prompt; the prefix-cache hit rate is what the server reported in the
streams' usage."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
from _serving import Server  # noqa: E402

from hetero.bench.multiturn import conversations, run_multi_turn  # noqa: E402
from hetero.bench.serve import summarize  # noqa: E402
from hetero.engine import LLM  # noqa: E402
from hetero.serve import build_app  # noqa: E402

BLOCK = 8
USERS, ROUNDS, SYSTEM, HISTORY, QUESTION, ANSWER = 3, 3, 16, 5, 4, 4


@pytest.fixture(scope="module")
def served(checkpoints):
    llm = LLM(str(checkpoints("qwen3")), backend="cpu_ref", dtype="float32", block_size=BLOCK, max_num_seqs=8)
    server = Server(build_app(llm, "tiny"))
    yield server, llm
    server.stop()


async def _play(url: str, convs, gaps):
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    try:
        return await run_multi_turn(client, "tiny", convs, ANSWER, gaps, None, True)
    finally:
        await client.close()


def _check_hit_rate(llm, before, results, seconds) -> None:
    summary = summarize(results, seconds, {})
    cached = llm.stats["cached_prompt_tokens"] - before["cached_prompt_tokens"]
    prompt = llm.stats["prompt_tokens"] - before["prompt_tokens"]
    assert summary["total_cached_tokens"] == cached == sum(r.cached_tokens for r in results) > 0
    assert summary["total_prompt_tokens"] == prompt and summary["prefix_hit_rate"] == pytest.approx(cached / prompt)


def test_token_conversations_keep_their_history_and_the_hit_rate_is_the_servers(served):
    server, llm = served
    convs = conversations(USERS, ROUNDS, SYSTEM, HISTORY, QUESTION, seed=1, fmt="tokens", vocab=250)
    assert all(c.system == convs[0].system for c in convs) and convs[0].history != convs[1].history
    before = dict(llm.stats)
    # the first user alone, then the others at once: they find the system prompt cached, not each other's
    results, seconds, turns = asyncio.run(_play(server.url, convs, [0.0, 0.5, 0.0]))
    assert len(results) == len(turns) == USERS * ROUNDS and all(r.ok for r in results)
    assert [(t.user, t.round) for t in turns] == [(u, r) for u in range(USERS) for r in range(ROUNDS)]
    for t, r in zip(turns, results):
        conv = convs[t.user]
        assert len(t.answer) == ANSWER == r.output_tokens and r.prompt_len == len(t.prompt)
        if t.round == 0:
            assert t.prompt == conv.system + conv.history + conv.questions[0]
        else:
            prev = turns[turns.index(t) - 1]
            assert t.prompt == prev.prompt + prev.answer + conv.questions[t.round]
            # the previous round's full blocks (its prompt at least) were cached when this round came
            assert r.cached_tokens >= len(prev.prompt) // BLOCK * BLOCK
    assert results[ROUNDS].cached_tokens >= SYSTEM // BLOCK * BLOCK  # user 1's first round: the shared prompt
    _check_hit_rate(llm, before, results, seconds)


def test_text_conversations_append_the_answers_text_and_the_hit_rate_is_the_servers(served):
    server, llm = served
    convs = conversations(USERS, ROUNDS, SYSTEM // 4, HISTORY, QUESTION, seed=2)
    assert all(isinstance(c.system, str) and c.system == convs[0].system for c in convs)
    assert len(convs[0].system.split()) == SYSTEM // 4 and convs[0].history != convs[1].history
    before = dict(llm.stats)
    results, seconds, turns = asyncio.run(_play(server.url, convs, [0.0, 0.5, 0.0]))
    assert len(results) == len(turns) == USERS * ROUNDS and all(r.ok and r.output_tokens == ANSWER for r in results)
    assert any(t.answer for t in turns)  # the char-level tokenizer spells some of the tiny model's picks
    for i, (t, r) in enumerate(zip(turns, results)):
        conv = convs[t.user]
        assert isinstance(t.prompt, str) and r.prompt_len == len(llm.encode(t.prompt))
        if t.round == 0:
            assert t.prompt == conv.system + conv.history + conv.questions[0]
        else:
            prev, prev_result = turns[i - 1], results[i - 1]
            assert t.prompt.startswith(prev.prompt + prev.answer) and t.prompt.endswith(conv.questions[t.round])
            assert r.cached_tokens >= prev_result.prompt_len // BLOCK * BLOCK
    system = len(llm.encode(convs[0].system))
    assert results[ROUNDS].cached_tokens >= system // BLOCK * BLOCK >= BLOCK
    _check_hit_rate(llm, before, results, seconds)


def test_the_command_runs_users_times_rounds_and_prints_the_hit_rate(served, tmp_path, capsys):
    from hetero.cli import main

    out = tmp_path / "run.json"
    args = ["bench-serve", "--url", served[0].url, "--dataset-name", "multi-turn", "--multi-turn-users", "2"]
    args += ["--multi-turn-rounds", "2", "--multi-turn-system-len", "16", "--multi-turn-history-len", "0"]
    args += ["--multi-turn-question-len", "3", "--random-output-len", "3", "--ignore-eos", "--json", str(out)]
    assert main(args) == 0
    text = capsys.readouterr().out.replace("\n", " ")
    assert "4 requests done, 0 failed" in text and "prefix cache hit rate" in text
    summary = json.loads(out.read_text())["summary"]
    assert summary["completed"] == 4 and summary["total_output_tokens"] == 12 and summary["prefix_hit_rate"] > 0
    assert (
        main([*args, "--multi-turn-format", "tokens"]) == 0 and "4 requests done, 0 failed" in capsys.readouterr().out
    )
    assert json.loads(out.read_text())["summary"]["total_prompt_tokens"] == 2 * (16 + 3) + 2 * (16 + 3 + 3 + 3)
    assert main([*args, "--dataset-path", str(out)]) == 2 and "--dataset-path" in capsys.readouterr().err
