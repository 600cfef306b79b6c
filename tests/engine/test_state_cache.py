"""Per-sequence state next to paged KV, on the toy hybrid model (``_toy_state``): batching, chunked
prefill and preemption never change greedy tokens, prefix caching never serves KV without the state
behind it, and a sequence's cache survives export and import."""

from __future__ import annotations

import pytest
import torch
from _toy_state import ARCH, ToyStateForCausalLM, make_checkpoint

from hetero.engine import LLM, SamplingParams
from hetero.engine.models import ARCHITECTURES
from hetero.engine.runtime.kv_cache import bytes_per_block, bytes_per_state_slot
from hetero.engine.runtime.sequence import Sequence

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
BS = 4


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    ps = [torch.randint(3, 256, (2 + 3 * i,), generator=gen).tolist() for i in range(7)]
    ps[4] = ps[5][:9] + ps[4]  # two full blocks of 4 in common, then more
    return ps


PROMPTS = _prompts()


@pytest.fixture(scope="module", autouse=True)
def toy_arch():
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(ARCHITECTURES, ARCH, ToyStateForCausalLM)
        yield


@pytest.fixture(scope="module", params=["zeros", "flag"])
def toy(request, checkpoints, tmp_path_factory):
    return str(make_checkpoint(checkpoints("qwen3"), tmp_path_factory.mktemp("toy") / "ckpt", request.param))


def engine(path: str, **kw) -> LLM:
    kw.setdefault("block_size", BS)
    kw.setdefault("enable_prefix_caching", False)
    return LLM(path, backend="cpu_ref", dtype="float32", **kw)


def tokens(llm: LLM, prompts=PROMPTS) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(prompts, GREEDY, progress=False)]


@pytest.fixture(scope="module")
def alone(toy):
    """Each prompt on its own, one after another: the answer every schedule must give."""
    llm = engine(toy)
    return [tokens(llm, [p])[0] for p in PROMPTS]


def test_the_state_matters(toy, alone, checkpoints):
    plain = engine(str(checkpoints("qwen3")))
    assert tokens(plain) != alone, "the toy layer must change the tokens, or nothing here tests the state"
    assert len({t for out in alone for t in out}) > len(PROMPTS), "degenerate tokens: a NaN state was read"


def test_mixed_batches_and_chunked_prefill_match_one_at_a_time(toy, alone):
    llm = engine(toy, max_num_seqs=4, max_num_batched_tokens=7)
    assert tokens(llm) == alone
    assert llm.block_manager.slots.num_free_slots == llm.runner.num_state_slots
    assert llm.block_manager.num_free_blocks == llm.block_manager.num_blocks


def test_preemption_matches_one_at_a_time(toy, alone):
    llm = engine(toy, max_num_seqs=6, num_kv_blocks=12)
    assert tokens(llm) == alone
    assert llm.stats["preemptions"] > 0


def test_a_prefix_hit_without_a_state_snapshot_is_refused(toy, alone):
    llm = engine(toy, enable_prefix_caching=True, num_state_snapshots=0)
    assert tokens(llm, [PROMPTS[5]]) == [alone[5]]
    probe = llm.block_manager
    seq = Sequence("probe", PROMPTS[4])
    assert len(probe.blocks.lookup(seq)[0]) == 2, "the paged pool alone would serve two cached blocks"
    assert probe.allocate(seq) == 0, "without the state at their end it must not"
    probe.free(seq)
    assert tokens(llm, [PROMPTS[4]]) == [alone[4]]
    assert llm.stats["cached_prompt_tokens"] == 0


def test_a_prefix_hit_with_its_state_snapshot_is_served_and_exact(toy, alone):
    """Snapshots are kept where a prompt's prefill stops at its last full block (16 of 17 tokens here) and
    wherever decoding crosses a block; a hit is served at either, never in between (two blocks shared)."""
    llm = engine(toy, enable_prefix_caching=True, max_num_seqs=4)  # 4 snapshots: none of these is evicted
    first = tokens(llm, [PROMPTS[5]])[0]
    assert first == alone[5]
    reference = engine(toy)
    cases = [(PROMPTS[5][:16] + [7, 8, 9], 16), (PROMPTS[5] + first[:3] + [7], 20), (PROMPTS[4], 0)]
    for prompt, hit in cases:
        before = llm.stats["cached_prompt_tokens"]
        assert tokens(llm, [prompt]) == tokens(reference, [prompt])
        assert llm.stats["cached_prompt_tokens"] - before == hit, prompt
    assert tokens(llm) == alone  # everything again, hits and evictions included


def test_the_state_pool_comes_out_of_the_kv_budget(toy):
    budget = 200_000
    llm = engine(toy, kv_cache_bytes=budget, max_num_seqs=3, enable_prefix_caching=True)
    model, r = llm.runner.model, llm.runner
    slot, block = bytes_per_state_slot(model, torch.float32), bytes_per_block(model, BS, torch.float32)
    assert slot == 2 * 64 * 4 and (r.num_state_slots, r.num_state_snapshots) == (3, 3)
    assert r.num_kv_blocks == min((budget - 6 * slot) // block, 3 * -(-llm.config.max_model_len // BS))


def _first_token(llm: LLM, prompt: list[int], params: SamplingParams) -> str:
    rid = llm.add_request(prompt, params)
    while not llm.scheduler.running or not llm.scheduler.running[0].output_token_ids:
        llm.step()
    return rid


@pytest.mark.parametrize("arch", ["toy", "qwen3"])
def test_export_then_import_continues_exactly(arch, toy, checkpoints):
    path = toy if arch == "toy" else str(checkpoints("qwen3"))
    prompt, params = PROMPTS[6], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    whole = tokens(engine(path), [prompt])[0]
    prefill = engine(path)
    rid = _first_token(prefill, prompt, params)
    cache = prefill.export_cache(rid)
    assert cache.num_tokens == len(prompt) and all(t.device.type == "cpu" for t in cache.paged.values())
    assert bool(cache.state) == (arch == "toy")
    decode = engine(path, block_size=8)  # another block size and other block ids
    decode.add_request(prompt + whole[:1], SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True), cache=cache)
    out = []
    while decode.has_unfinished():
        out += [o for o in decode.step() if o.finished]
    assert out[0].token_ids == whole[1:]
    assert decode.stats["steps"] == 5, "only the last prompt token and the decodes were computed"


def test_an_import_that_does_not_fit_is_refused(toy, checkpoints):
    llm = engine(toy)
    rid = _first_token(llm, PROMPTS[3], GREEDY)
    cache = llm.export_cache(rid)
    with pytest.raises(ValueError, match="cache"):
        llm.add_request(PROMPTS[3][:3], GREEDY, cache=cache)  # more cached tokens than the prompt
    with pytest.raises(ValueError, match="state entries"):
        engine(str(checkpoints("qwen3"))).add_request(PROMPTS[3] + [5], GREEDY, cache=cache)


def test_a_cache_of_other_tokens_is_refused(toy):
    llm = engine(toy)
    rid = _first_token(llm, PROMPTS[3], GREEDY)
    cache = llm.export_cache(rid)
    assert cache.token_ids == PROMPTS[3]
    other = list(PROMPTS[3]) + [5]
    other[2] = (other[2] + 1) % 50 + 1
    with pytest.raises(ValueError, match="other tokens than this prompt's .*position 2"):
        llm.add_request(other, GREEDY, cache=cache)
    cache.token_ids = None  # a cache that does not record its tokens is taken on trust
    llm.add_request(other, GREEDY, cache=cache)
