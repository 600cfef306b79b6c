"""The pieces of prefill/decode disaggregation below the HTTP servers: the wire layout, the model
fingerprint and refusal, the gloo link, the sender and receiver threads, and caches of four model
families crossing from cpu_ref to torch over the link with greedy tokens equal to one engine."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time

import pytest
import torch
from _serving import TIMEOUT, linked, prompts

from hetero.engine import LLM, SamplingParams
from hetero.engine.runtime.cache_io import SequenceCache
from hetero.serve.pd.identity import Identity, fingerprint, refusal
from hetero.serve.pd.link import KVLinkRefused
from hetero.serve.pd.wire import Assembly, header_of, payloads, sizes

PREFILL = dict(backend="cpu_ref", dtype="float32", block_size=8, max_num_seqs=16)
DECODE = dict(backend="torch", dtype="float32", block_size=16, max_num_seqs=16)


def identity(paged=(("a.k", "torch.bfloat16", (2, 3)),), state=(("b.s", "torch.float32", (4,)),), fp="f" * 32):
    return Identity("decode", "/m", fp, tuple(paged), tuple(state))


def random_cache(ident: Identity, n: int) -> SequenceCache:
    dt = lambda name: getattr(torch, name.removeprefix("torch."))  # noqa: E731
    paged = {name: torch.randn(n, *s).to(dt(d)) for name, d, s in ident.paged}
    state = {name: torch.randn(*s).to(dt(d)) for name, d, s in ident.state}
    return SequenceCache(n, paged, state, list(range(3, 3 + n)))


@pytest.mark.parametrize("n, per", [(1, 16), (13, 4), (16, 16), (17, 16)])
def test_the_wire_layout_round_trips_a_cache(n, per):
    ident = identity()
    cache = random_cache(ident, n)
    header = header_of(cache, "t1", ident, per)
    sent = list(payloads(cache, header))
    assert [p.numel() for p in sent] == sizes(header) and len(sent) == -(-n // per) + 1
    got = Assembly(header, ident, max_tokens=64)
    for i, p in enumerate(sent):
        got.take(i, p)
    out = got.result()
    assert out.num_tokens == n and out.token_ids == cache.token_ids
    assert torch.equal(out.paged["a.k"], cache.paged["a.k"]) and out.paged["a.k"].dtype == torch.bfloat16
    assert torch.equal(out.state["b.s"], cache.state["b.s"])


@pytest.mark.parametrize(
    "change, words",
    [
        (dict(fingerprint="0" * 32), "model fingerprint"),
        (dict(num_tokens=65), "num_tokens must be"),
        (dict(tokens_per_block=0), "tokens_per_block"),
        (dict(token_ids=[1]), "token ids for 5 tokens"),
        (dict(paged=[["a.k", "torch.float32", [2, 3]]]), "paged entries"),
    ],
)
def test_a_header_that_does_not_fit_this_instance_is_refused(change, words):
    ident = identity()
    header = dict(header_of(random_cache(ident, 5), "t1", ident, 4), **change)
    with pytest.raises(ValueError, match=f"'t1' refused: .*{words}"):
        Assembly(header, ident, max_tokens=64)


def test_the_fingerprint_sees_other_weights_and_refusal_names_the_difference(checkpoints, tmp_path):
    from hetero.tools import tiny

    a = checkpoints("qwen3")
    copy = tmp_path / "copy"
    shutil.copytree(a, copy)
    other = tiny.build("qwen3", tmp_path / "other", seed=1)
    assert fingerprint(a) == fingerprint(copy) != fingerprint(other)
    mine = identity()
    assert refusal(mine, mine) is None
    assert "serves another model" in refusal(mine, identity(fp="0" * 32))
    assert "holds torch.float32 [2, 3], this decode instance (/m) torch.bfloat16" in refusal(
        mine, identity(paged=(("a.k", "torch.float32", (2, 3)),))
    )
    assert "different state cache entries" in refusal(mine, identity(state=()))


def test_a_link_between_two_models_is_refused_on_both_sides():
    pre, dec = linked(identity(fp="1" * 32), identity(fp="2" * 32))
    for end in (pre, dec):
        assert isinstance(end, KVLinkRefused) and "serves another model" in str(end)


def test_the_link_keeps_in_step_past_a_refused_transfer():
    ident = identity()
    pre, dec = linked(ident, ident)
    caches = [random_cache(ident, 9), random_cache(ident, 70), random_cache(ident, 3)]

    def send():
        for i, cache in enumerate(caches):
            header = header_of(cache, f"t{i}", pre.identity, 4)
            pre.send(header, payloads(cache, header))

    sender = threading.Thread(target=send)
    sender.start()
    got = []
    for _ in caches:
        header = dec.recv_header()
        try:
            assembly = Assembly(header, dec.identity, max_tokens=64)
        except ValueError as e:  # 70 tokens: more than this instance takes; drained, and the next one comes
            got.append(str(e))
            for _ in dec.recv_payloads(header):
                pass
            continue
        for i, data in enumerate(dec.recv_payloads(header)):
            assembly.take(i, data)
        got.append(assembly.result())
    sender.join(30)
    assert "'t1' refused: num_tokens" in got[1]
    for i in (0, 2):
        assert torch.equal(got[i].paged["a.k"], caches[i].paged["a.k"])
        assert torch.equal(got[i].state["b.s"], caches[i].state["b.s"])


@pytest.mark.parametrize("arch", ["qwen3", "deepseek_v3", "deepseek_v32", "qwen3_5"])
def test_caches_cross_backends_over_the_link_with_equal_tokens(arch, checkpoints):
    """Dense KV, the MLA latent (with DSA's indexer keys) and the linear-attention state, exported on
    cpu_ref, imported on torch."""
    from hetero.serve.engine_loop import EngineLoop
    from hetero.serve.pd.transfer import KVReceiver, KVSender

    path = str(checkpoints(arch))
    ps = prompts(3, seed=7)
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    want = [o.token_ids for o in LLM(path, **DECODE).generate(ps, greedy, progress=False)]
    prefill, decode = LLM(path, **PREFILL), LLM(path, **DECODE)
    pre, dec = linked(Identity.of(prefill, "prefill"), Identity.of(decode, "decode"))
    sender, receiver = KVSender(pre, 5), KVReceiver(dec, decode.config.max_model_len)
    exporter = EngineLoop(prefill)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)

    async def run():
        receiver.bind(asyncio.get_running_loop())
        for i, p in enumerate(ps):
            cache = await exporter.export(p[:-1])
            assert bool(cache.state) == (arch == "qwen3_5") and cache.num_tokens == len(p) - 1
            await sender.send(f"t{i}", cache)
            decode.add_request(p, params, f"r{i}", cache=await receiver.take(f"t{i}", 30))

    exporter.start()
    try:
        asyncio.run(asyncio.wait_for(run(), TIMEOUT))
    finally:
        exporter.stop()
    done = {}
    while decode.has_unfinished():
        done.update((o.request_id, o.token_ids) for o in decode.step() if o.finished)
    assert [done[f"r{i}"] for i in range(3)] == want
    assert sum(decode.stats["step_tokens"]) == 3 * 8, "decode computed only each last prompt token and the outputs"
    assert prefill.block_manager.num_used_blocks == 0, "the exported requests were ended"
    assert decode.stats["prompt_tokens"] == sum(map(len, ps))


@pytest.fixture
def ends(request):
    """A sender and a receiver over a fresh link, the receiver bound to a loop of its own thread
    (its unclaimed caches dropped after ``request.param`` seconds, 120 unless parametrized)."""
    from hetero.serve.pd.transfer import KVReceiver, KVSender

    ident = identity()
    pre, dec = linked(ident, ident)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    receiver = KVReceiver(dec, max_tokens=64, unclaimed_s=getattr(request, "param", 120.0))
    loop.call_soon_threadsafe(receiver.bind, loop)
    yield KVSender(pre, 4), receiver, loop, ident
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def on(loop, coro, timeout: float = 30):
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)


def test_a_cancelled_send_leaves_the_sender_working(ends):
    sender, receiver, loop, ident = ends
    caches = [random_cache(ident, 9), random_cache(ident, 5)]

    async def cancel_one():
        task = asyncio.ensure_future(sender.send("gone", caches[0]))
        await asyncio.sleep(0)
        task.cancel()
        return await asyncio.gather(task, return_exceptions=True)

    assert isinstance(on(loop, cancel_one())[0], asyncio.CancelledError)
    assert on(loop, sender.send("next", caches[1])) > 0 and sender.error is None
    assert torch.equal(on(loop, receiver.take("next", 30)).paged["a.k"], caches[1].paged["a.k"])


@pytest.mark.parametrize("ends", [0.4], indirect=True)
def test_a_cache_nobody_claims_is_dropped_and_a_second_taker_is_refused(ends):
    sender, receiver, loop, ident = ends
    on(loop, sender.send("orphan", random_cache(ident, 3)))
    for present in (True, False):  # it arrives, and with no other transfer to prompt it, it goes
        deadline = time.monotonic() + 30
        while ("orphan" in receiver._ready) != present:
            assert time.monotonic() < deadline, f"the unclaimed cache was never {'kept' if present else 'dropped'}"
            time.sleep(0.02)

    async def two_takers():
        first = asyncio.ensure_future(receiver.take("late", 30))
        await asyncio.sleep(0.05)
        with pytest.raises(ValueError, match="already being waited for"):
            await receiver.take("late", 30)
        return first

    first = on(loop, two_takers())
    on(loop, sender.send("late", random_cache(ident, 2)))
    assert asyncio.run_coroutine_threadsafe(asyncio.wait_for(first, 30), loop).result(40).num_tokens == 2


def test_a_receiver_that_fails_closes_the_link_and_the_sender_learns_it(ends, monkeypatch):
    sender, receiver, loop, ident = ends

    def broken(header):
        raise RuntimeError("planted: the receiver broke")

    monkeypatch.setattr(receiver, "_receive", broken)
    with pytest.raises(RuntimeError):  # this transfer, or at the latest the next, finds the link closed
        for i in range(3):
            on(loop, sender.send(f"t{i}", random_cache(ident, 4)), timeout=60)
    assert sender.error is not None and "planted" in repr(receiver.error)
    with pytest.raises(RuntimeError, match="link .*down"):
        on(loop, receiver.take("t9", 5))
