"""Scheduler: continuous batching, chunked prefill, preemption by recompute, stop conditions.

A fake model stands in for the runner: it writes each computed row's token into a
token-level "KV cache" at the slot the block table gives, then derives the next
token from everything the sequence reads back from that cache. Wrong block tables,
prefix hits or recompute show up as different tokens (or a KeyError).
"""

from __future__ import annotations

import pytest

from hetero.engine.runtime.block_manager import BlockManager
from hetero.engine.runtime.scheduler import ScheduledBatch, Scheduler
from hetero.engine.runtime.sequence import SamplingParams, Sequence, SequenceStatus

BS = 4
EOS = 2


def next_token(history: list[int]) -> int:
    return sum((i + 1) * t for i, t in enumerate(history)) % 61 + 3  # never EOS


class FakeModel:
    def __init__(self):
        self.kv: dict[int, int] = {}

    def slot(self, seq: Sequence, pos: int) -> int:
        return seq.block_table[pos // BS] * BS + pos % BS

    def run(self, batch: ScheduledBatch) -> list[int]:
        for seq, n, length in zip(batch.seqs, batch.query_lens, batch.seq_lens):
            for pos in range(length - n, length):
                self.kv[self.slot(seq, pos)] = seq.tokens(pos, pos + 1)[0]
        out = []
        for seq, length, sample in zip(batch.seqs, batch.seq_lens, batch.sample):
            history = [self.kv[self.slot(seq, p)] for p in range(length)]
            assert history == seq.tokens(0, length), f"{seq.request_id} reads a stale KV cache"
            if sample:
                out.append(next_token(history))
        return out


def check_batch(batch: ScheduledBatch, budget: int, max_num_seqs: int, decoding: set[str]) -> None:
    assert 0 < batch.num_tokens <= budget
    assert len(batch) <= max_num_seqs
    first_chunk = next((i for i, n in enumerate(batch.query_lens) if n > 1), len(batch))
    assert not any(seq.request_id in decoding for seq in batch.seqs[first_chunk:]), "a decode after a prefill chunk"
    for seq, n, length in zip(batch.seqs, batch.query_lens, batch.seq_lens):
        assert seq.status is SequenceStatus.RUNNING
        assert length == seq.num_computed_tokens + n <= seq.num_tokens
        assert len(seq.block_table) * BS >= length


def run(prompts, *, num_blocks=64, budget=64, max_num_seqs=8, max_tokens=6, prefix=True, late=(), on_batch=None):
    """Serve ``prompts`` (and ``late`` ones added after two steps); token outputs by request id, and the scheduler."""
    sched = Scheduler(
        BlockManager(num_blocks, BS, prefix),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=200,
        eos_token_ids=[EOS],
    )
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    seqs = [Sequence(f"r{i}", p, params) for i, p in enumerate(list(prompts) + list(late))]
    for s in seqs[: len(prompts)]:
        sched.add(s)
    model, steps = FakeModel(), 0
    while sched.has_unfinished():
        if steps == 2:
            for s in seqs[len(prompts) :]:
                sched.add(s)
        decoding = {s.request_id for s in sched.running if s.num_tokens - s.num_computed_tokens == 1}
        batch = sched.schedule()
        check_batch(batch, budget, max_num_seqs, decoding)
        if on_batch:
            on_batch(steps, batch)
        sched.postprocess(batch, model.run(batch))
        steps += 1
        assert steps < 1000
    assert sched.block_manager.num_free_blocks == num_blocks
    return {s.request_id: s.output_token_ids for s in seqs}, sched


def reference(prompts, max_tokens=6):
    out = {}
    for i, p in enumerate(prompts):
        tokens = list(p)
        for _ in range(max_tokens):
            tokens.append(next_token(tokens))
        out[f"r{i}"] = tokens[len(p) :]
    return out


PROMPTS = [list(range(10, 10 + n)) for n in (3, 9, 17, 5, 30, 12)] + [[10, 11, 12, 13, 14, 15, 16, 17, 40, 41]]


def test_batched_run_matches_one_at_a_time():
    outputs, sched = run(PROMPTS)
    assert outputs == reference(PROMPTS)
    assert sched.num_preemptions == 0


def test_chunked_prefill_splits_a_long_prompt_with_decodes_first():
    seen = []
    outputs, _ = run(
        [[5, 6, 7], list(range(20, 70))],
        budget=16,
        on_batch=lambda i, b: seen.append(
            [(s.request_id, n, smp) for s, n, smp in zip(b.seqs, b.query_lens, b.sample)]
        ),
    )
    assert outputs == reference([[5, 6, 7], list(range(20, 70))])
    chunks = [(n, smp) for step in seen for rid, n, smp in step if rid == "r1" and n > 1]
    assert sum(n for n, _ in chunks) == 50 and len(chunks) >= 4
    assert [smp for _, smp in chunks] == [False] * (len(chunks) - 1) + [True]
    # while r1 is prefilling, r0 decodes in the same steps and comes first
    mixed = [step for step in seen[1:] if len(step) == 2]
    assert len(mixed) >= 3 and all(step[0][:2] == ("r0", 1) for step in mixed)
    assert all(sum(n for _, n, _ in step) <= 16 for step in seen)


def test_new_requests_join_a_running_batch():
    seen = []
    late = [[90, 91, 92, 93, 94]]
    outputs, _ = run(
        [[5, 6, 7], [8, 9]],
        late=late,
        max_tokens=8,
        on_batch=lambda i, b: seen.append((i, [(s.request_id, n) for s, n in zip(b.seqs, b.query_lens)])),
    )
    assert outputs == reference([[5, 6, 7], [8, 9]] + late, max_tokens=8)
    joined = next(step for i, step in seen if any(rid == "r2" for rid, _ in step))
    assert joined[0] in (("r0", 1), ("r1", 1)) and joined[-1] == ("r2", 5)


def test_preemption_when_blocks_run_out_keeps_the_token_history():
    prompts = [list(range(30 + i, 41 + i)) for i in range(4)]
    preempted = []
    outputs, sched = run(
        prompts, num_blocks=9, max_tokens=10, on_batch=lambda i, b: preempted.extend(s.request_id for s in b.preempted)
    )
    assert sched.num_preemptions > 0 and preempted
    assert outputs == reference(prompts, max_tokens=10)


def test_preempted_sequence_is_the_most_recent_and_resumes_first():
    sched = Scheduler(BlockManager(6, BS), max_num_seqs=2, max_num_batched_tokens=64, max_model_len=100)
    params = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
    a, b, c = (Sequence(rid, [t] * 8, params) for rid, t in (("a", 1), ("b", 3), ("c", 4)))
    for s in (a, b, c):
        sched.add(s)
    batch = sched.schedule()  # a and b prefill (2 + 2 blocks); c waits for a slot
    assert batch.seqs == [a, b]
    sched.postprocess(batch, [5, 5])
    for _ in range(8):  # decodes until the 6 blocks no longer suffice
        batch = sched.schedule()
        if batch.preempted:
            break
        sched.postprocess(batch, [5] * len(batch.sampled_seqs))
    assert batch.preempted == [b] and list(sched.waiting) == [b, c] and b.num_computed_tokens == 0
    assert b.block_table == [] and batch.seqs == [a], "nothing is admitted in a step that preempts"
    assert b.num_tokens > 8, "the generated tokens stay with the preempted sequence"
    sched.postprocess(batch, [5])
    while b.status is not SequenceStatus.RUNNING:
        batch = sched.schedule()
        sched.postprocess(batch, [5] * len(batch.sampled_seqs))
    assert c not in sched.running or sched.running.index(b) < sched.running.index(c), (
        "the preempted sequence resumes before later arrivals"
    )


def test_prefix_caching_on_and_off_give_the_same_tokens_and_on_hits():
    shared = list(range(50, 62))
    prompts = [shared + [i, i + 1] for i in range(5)]
    on, sched_on = run(prompts[:1], late=prompts[1:], budget=16)
    off, sched_off = run(prompts[:1], late=prompts[1:], budget=16, prefix=False)
    assert on == off == reference(prompts)


def test_prefix_cache_hits_are_counted():
    shared = list(range(50, 62))
    sched = Scheduler(BlockManager(32, BS), max_num_seqs=8, max_num_batched_tokens=64, max_model_len=100)
    model = FakeModel()
    first = Sequence("a", shared + [1], SamplingParams(temperature=0, max_tokens=2))
    sched.add(first)
    sched.postprocess(b := sched.schedule(), model.run(b))
    second = Sequence("b", shared + [2, 3], SamplingParams(temperature=0, max_tokens=2))
    sched.add(second)
    batch = sched.schedule()
    assert second.num_cached_tokens == 12
    assert batch.query_lens[-1] == 2 and batch.seq_lens[-1] == 14
    sched.postprocess(batch, model.run(batch))


def test_max_num_seqs_limits_the_running_set():
    sizes = []
    outputs, _ = run(PROMPTS, max_num_seqs=2, on_batch=lambda i, b: sizes.append(len(b)))
    assert outputs == reference(PROMPTS) and max(sizes) == 2


def finish(prompt, params, tokens, max_model_len=100):
    sched = Scheduler(
        BlockManager(64, BS),
        max_num_seqs=4,
        max_num_batched_tokens=64,
        max_model_len=max_model_len,
        eos_token_ids=[EOS],
    )
    seq = Sequence("x", prompt, params)
    sched.add(seq)
    for t in tokens:
        batch = sched.schedule()
        sched.postprocess(batch, [t])
        if seq.is_finished:
            break
    return seq


def test_stop_conditions():
    greedy = dict(temperature=0)
    seq = finish([5, 6], SamplingParams(max_tokens=10, **greedy), [7, EOS, 8])
    assert seq.output_token_ids == [7, EOS] and seq.finish_reason == "stop"
    seq = finish([5, 6], SamplingParams(max_tokens=3, ignore_eos=True, **greedy), [7, EOS, 8, 9])
    assert seq.output_token_ids == [7, EOS, 8] and seq.finish_reason == "length"
    seq = finish([5, 6], SamplingParams(max_tokens=10, stop_token_ids=[9], **greedy), [7, 9, 8])
    assert seq.output_token_ids == [7, 9] and seq.finish_reason == "stop"
    seq = finish([5, 6, 7], SamplingParams(max_tokens=10, **greedy), [8, 8, 8, 8], max_model_len=5)
    assert seq.output_token_ids == [8, 8] and seq.finish_reason == "length"
    assert seq.block_table == [] and seq.status is SequenceStatus.FINISHED


def test_requests_that_can_never_fit_are_refused_at_add_time():
    sched = Scheduler(BlockManager(4, BS), max_num_seqs=4, max_num_batched_tokens=64, max_model_len=40)
    with pytest.raises(ValueError, match=r"prompt of 41 tokens .*max_model_len \(40\)"):
        sched.add(Sequence("long", [1] * 41))
    with pytest.raises(ValueError, match=r"prompt of 10 tokens with max_tokens=20 needs 8 KV blocks .* has 4"):
        sched.add(Sequence("big", [1] * 10, SamplingParams(max_tokens=20)))
    with pytest.raises(ValueError, match="empty"):
        sched.add(Sequence("empty", []))
    sched.add(Sequence("fits", [1] * 10, SamplingParams(max_tokens=7)))  # 16 tokens of KV: exactly 4 blocks
    assert not sched.running and len(sched.waiting) == 1
