"""LLM.step streams per-request deltas; abort frees a request's blocks at once, waiting or running."""

from __future__ import annotations

import pytest
import torch

from hetero.engine import LLM, SamplingParams

PARAMS = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(4)
    return [torch.randint(3, 256, (n,), generator=gen).tolist() for n in (5, 11, 19)]


@pytest.fixture(scope="module")
def path(checkpoints):
    return str(checkpoints("qwen3"))


def engine(path: str, **kw) -> LLM:
    return LLM(path, backend="cpu_ref", dtype="float32", block_size=4, **kw)


def test_step_deltas_add_up_to_generate(path):
    prompts = _prompts()
    want = [o.token_ids for o in engine(path).generate(prompts, PARAMS, progress=False)]
    llm = engine(path, max_num_batched_tokens=8)
    ids = [llm.add_request(p, PARAMS) for p in prompts]
    streamed: dict[str, list[int]] = {i: [] for i in ids}
    final = {}
    while llm.has_unfinished():
        for out in llm.step():
            assert out.new_token_ids, "a request is reported only when it moved"
            assert out.token_ids == streamed[out.request_id] + out.new_token_ids
            streamed[out.request_id] += out.new_token_ids
            assert (out.finish_reason is not None) == (len(out.token_ids) == PARAMS.max_tokens)
            assert out.finished == (out.text is not None)  # text once it ends (the checkpoint has a tokenizer)
            if out.finished:
                final[out.request_id] = out
    assert [streamed[i] for i in ids] == want == [final[i].token_ids for i in ids]


def test_abort_a_running_and_a_waiting_request_frees_them(path):
    prompts = _prompts()
    llm = engine(path, max_num_seqs=2)
    ids = [llm.add_request(p, PARAMS) for p in prompts]
    llm.step()
    running = {s.request_id for s in llm.scheduler.running}
    assert running == set(ids[:2]) and [s.request_id for s in llm.scheduler.waiting] == [ids[2]]
    held = len(llm.scheduler.running[0].block_table)
    free = llm.block_manager.num_free_blocks
    assert llm.abort(ids[0]) and llm.abort(ids[2])
    assert llm.block_manager.num_free_blocks == free + held
    assert not llm.abort(ids[0]) and not llm.abort("no-such-request")
    seen = set()
    while llm.has_unfinished():
        seen |= {o.request_id for o in llm.step()}
    assert seen == {ids[1]}
    assert llm.block_manager.num_free_blocks == llm.block_manager.num_blocks


def test_a_fresh_request_after_an_abort_is_unaffected(path):
    prompts = _prompts()
    alone = engine(path).generate([prompts[1]], PARAMS, progress=False)[0].token_ids
    llm = engine(path)
    first = llm.add_request(prompts[0], PARAMS)
    llm.step()
    llm.abort(first)
    assert llm.generate([prompts[1]], PARAMS, progress=False)[0].token_ids == alone
