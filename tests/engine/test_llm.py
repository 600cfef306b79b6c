"""LLM on a tiny Qwen3 checkpoint (cpu_ref, float32): batching, preemption, chunked prefill and
prefix caching never change greedy tokens; text in and out; seeded sampling; clear errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from hetero.engine import LLM, SamplingParams

MAX_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


def make_prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    ps = [torch.randint(3, 256, (3 + 5 * i,), generator=gen).tolist() for i in range(16)]
    ps[5] = ps[3][:10] + ps[5]  # shared prefixes: some full blocks of 8 in common
    ps[9] = ps[7][:24] + ps[9]
    ps[12] = ps[7][:17] + ps[12]
    return ps


PROMPTS = make_prompts()


@pytest.fixture(scope="module")
def path(checkpoints):
    return str(checkpoints("qwen3"))


def llm(path, **kw) -> LLM:
    kw.setdefault("block_size", 8)
    return LLM(path, backend="cpu_ref", dtype="float32", **kw)


def tokens(engine: LLM, prompts=PROMPTS, params=GREEDY) -> list[list[int]]:
    return [o.token_ids for o in engine.generate(prompts, params, progress=False)]


@pytest.fixture(scope="module")
def alone(path) -> list[list[int]]:
    """Each request by itself in the engine, no prefix cache."""
    return tokens(llm(path, max_num_seqs=1, enable_prefix_caching=False))


def test_sixteen_together_equal_one_at_a_time(path, alone):
    engine = llm(path, max_num_seqs=16)
    assert tokens(engine) == alone
    assert max(engine.stats["kv_blocks_in_use"]) > 16, "the requests really ran side by side"
    assert all(len(t) == MAX_TOKENS for t in alone) and len({tuple(t) for t in alone}) > 1


def test_a_cache_too_small_for_all_preempts_and_gives_the_same_tokens(path, alone):
    engine = llm(path, max_num_seqs=16, num_kv_blocks=14)  # the longest request needs 11 blocks of 8
    assert tokens(engine) == alone
    assert engine.stats["preemptions"] > 0
    assert max(engine.stats["kv_blocks_in_use"]) <= 14


def test_chunked_prefill_gives_the_same_tokens(path, alone):
    engine = llm(path, max_num_seqs=16, max_num_batched_tokens=16)
    assert tokens(engine) == alone
    assert max(engine.stats["step_tokens"]) <= 16


def test_prefix_caching_on_and_off_give_the_same_tokens(path, alone):
    on = llm(path, max_num_seqs=4, max_num_batched_tokens=32)
    off = llm(path, max_num_seqs=4, max_num_batched_tokens=32, enable_prefix_caching=False)
    assert tokens(on) == tokens(off) == alone
    assert on.stats["cached_prompt_tokens"] > 0 and off.stats["cached_prompt_tokens"] == 0
    again = on.generate(PROMPTS[9:10], GREEDY, progress=False)[0]  # the whole prompt was computed before
    assert again.token_ids == alone[9] and again.metrics["num_cached_tokens"] == 8 * ((len(PROMPTS[9]) - 1) // 8)


def test_text_in_and_out(path):
    engine = llm(path)
    outs = engine.generate(["hello world", "abc"], GREEDY, progress=False)
    tok = engine.tokenizer
    assert [o.prompt_token_ids for o in outs] == [tok.encode("hello world"), tok.encode("abc")]
    assert [o.text for o in outs] == [tok.decode(o.token_ids, skip_special_tokens=True) for o in outs]
    assert [o.token_ids for o in outs] == tokens(engine, [tok.encode("hello world"), tok.encode("abc")])


def test_step_api_metrics_and_stats(path, alone):
    engine = llm(path, max_num_seqs=16)
    ids = [engine.add_request(p, GREEDY, request_id=f"req{i}") for i, p in enumerate(PROMPTS[:3])]
    done = {}
    while engine.has_unfinished():
        done.update((o.request_id, o) for o in engine.step())
    assert sorted(done) == ids and [done[i].token_ids for i in ids] == alone[:3]
    for o in done.values():
        m = o.metrics
        assert m["arrival_time"] <= m["first_token_time"] <= m["finish_time"] and o.finish_reason == "length"
    s = engine.stats
    assert s["steps"] == len(s["kv_blocks_in_use"]) == len(s["step_tokens"]) == MAX_TOKENS
    assert s["generated_tokens"] == 3 * MAX_TOKENS and s["prompt_tokens"] == sum(map(len, PROMPTS[:3]))


def test_seeded_sampling_is_the_same_alone_or_in_a_batch(path):
    engine = llm(path, max_num_seqs=16)
    seeded = SamplingParams(temperature=0.9, top_k=50, top_p=0.95, max_tokens=MAX_TOKENS, seed=1234, ignore_eos=True)
    others = SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    single = engine.generate([PROMPTS[4]], seeded, progress=False)[0].token_ids
    batch = engine.generate(PROMPTS[:6], [others] * 4 + [seeded, others], progress=False)
    assert batch[4].token_ids == single
    unseeded = [o.token_ids for o in batch[:4]]
    assert unseeded != tokens(engine, PROMPTS[:4]), "temperature 1 should not reproduce greedy decoding"


def test_errors_are_clear(path, tmp_path, monkeypatch):
    bare = tmp_path / "no_tokenizer"
    bare.mkdir()
    for f in Path(path).iterdir():
        if f.name == "config.json" or f.suffix == ".safetensors" or f.name.endswith(".index.json"):
            shutil.copy(f, bare / f.name)
    engine = llm(str(bare))
    with pytest.raises(ValueError, match="no tokenizer files"):
        engine.generate("hello", GREEDY)
    with pytest.raises(ValueError, match=r"prompt of 600 tokens is longer than max_model_len \(512\)"):
        engine.generate([[5, 6], [7] * 600], GREEDY)
    assert not engine.has_unfinished(), "a refused batch leaves nothing behind"
    with pytest.raises(ValueError, match=r"vocab_size=256"):
        engine.generate([[5, 999]], GREEDY)
    engine.add_request([5, 6, 7], GREEDY)
    with pytest.raises(RuntimeError, match="unfinished"):
        engine.generate([[1, 2]], GREEDY)
    with pytest.raises(ValueError, match="torchrun --nproc-per-node 2"):
        LLM(path, tensor_parallel_size=2)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LLM(str(tmp_path / "missing"))
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"WORLD_SIZE.*tensor_parallel_size=1"):
        LLM(path)
