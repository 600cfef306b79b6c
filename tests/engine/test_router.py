"""hetero instances behind vLLM's own router (the real ``vllm-router`` binary, pinned in the serve extra): every
policy gives offline ``generate``'s tokens, streamed and not, and kv_aware follows hetero's KV events to the
instance that holds a prompt's prefix."""

from __future__ import annotations

import functools
import json
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("zmq")
from _serving import ROUTER, Server, client, concurrent_streams, offline, router  # noqa: E402

from hetero.distributed import free_port  # noqa: E402
from hetero.engine import LLM  # noqa: E402
from hetero.serve import build_app  # noqa: E402
from hetero.serve.kv_events import KVEventPublisher, KVEventsConfig  # noqa: E402

ENGINE = dict(backend="cpu_ref", dtype="float32", block_size=16, max_num_seqs=16)
offline = functools.partial(offline, **ENGINE)
GREEDY = dict(temperature=0.0, extra_body={"ignore_eos": True, "return_token_ids": True})
POLICIES = ("random", "round_robin", "cache_aware", "power_of_two", "consistent_hash", "sticky_least_loaded")


@pytest.fixture(scope="module")
def instances(checkpoints):
    """Three instances of a tiny Qwen3 (in this process, each its own engine thread), publishing KV events."""
    if not Path(ROUTER).exists():
        pytest.skip("vllm-router is not installed (pip install 'hetero[serve]')")
    path = str(checkpoints("qwen3"))
    made = []
    for _ in range(3):
        events = f"tcp://127.0.0.1:{free_port()}"
        publisher = KVEventPublisher(KVEventsConfig(enable_kv_cache_events=True, endpoint=events))
        made.append((Server(build_app(LLM(path, **ENGINE), "tiny", kv_events=publisher)), events))
    yield path, made
    for server, _ in made:
        server.stop()


def _prompts(n: int, length: int, seed: int) -> list[list[int]]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 256, (length,), generator=gen).tolist() for _ in range(n)]


def test_every_policy_gives_offline_tokens_streamed_and_not(instances):
    path, made = instances
    urls = [s.url for s, _ in made]
    ps = _prompts(3, 20, seed=1)
    want = offline(path, ps, 5)
    for policy in (*POLICIES, "kv_aware"):
        extra = ["--kv-event-model", "tiny"] if policy == "kv_aware" else []
        extra += [f"--kv-event-source={s.url}={events}" for s, events in made] if policy == "kv_aware" else []
        with router(urls, "--policy", policy, *extra) as url:
            c = client(url)
            got = [
                c.completions.create(model="tiny", prompt=p, max_tokens=5, **GREEDY).choices[0].token_ids for p in ps
            ]
            assert got == want, policy
            assert concurrent_streams(c, "tiny", ps, 5) == want, policy


def test_kv_aware_sends_a_shared_prefix_to_the_instance_that_holds_it(instances):
    """For each instance in turn: a 64-token prefix computed there (directly), then prefix + suffix through the
    router is served there, its prefix from the cache. (vllm-router scores only requests whose fields it knows:
    ``return_token_ids`` or any other field outside OpenAI's and vLLM's makes it route by load alone.)"""
    _, made = instances
    urls = [s.url for s, _ in made]
    sources = [f"--kv-event-source={s.url}={events}" for s, events in made]
    plain = dict(temperature=0.0, extra_body={"ignore_eos": True})
    with router(
        urls, "--policy", "kv_aware", "--kv-event-model", "tiny", "--kv-event-block-size", "16", *sources
    ) as url:
        for i, (server, _) in enumerate(made):
            prefix = _prompts(1, 64, seed=20 + i)[0]
            client(server.url).completions.create(model="tiny", prompt=prefix, max_tokens=1, **plain)
            time.sleep(0.5)  # the events reach the router
            got = client(url).completions.create(model="tiny", prompt=prefix + [7, 8], max_tokens=1, **plain)
            assert got.usage.prompt_tokens_details.cached_tokens == 64, f"instance {i}'s prefix was not found"


def test_kv_events_are_vllms_frames_and_follow_the_prefix_cache(checkpoints):
    """A SUB socket sees what vllm-router's kv_aware subscriber reads: [topic, 8-byte big-endian sequence,
    msgpack([ts, [event maps], rank 0])]; one BlockStored per computed full block, chained by parent hash, with
    the prompt's tokens; evictions as BlockRemoved of the same hashes; /flush_cache evicts what is idle."""
    import msgpack
    import zmq

    endpoint = f"tcp://127.0.0.1:{free_port()}"
    publisher = KVEventPublisher(KVEventsConfig(enable_kv_cache_events=True, endpoint=endpoint, topic="kv"))
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.connect(endpoint)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.setsockopt(zmq.RCVTIMEO, 10_000)
    llm = LLM(str(checkpoints("qwen3")), **dict(ENGINE, num_kv_blocks=8))
    server = Server(build_app(llm, "tiny", kv_events=publisher))
    try:
        time.sleep(0.5)  # the subscription reaches the publisher (ZMQ's slow joiner)
        prompt = _prompts(1, 50, seed=3)[0]
        client(server.url).completions.create(model="tiny", prompt=prompt, max_tokens=1, **GREEDY)
        frames = sub.recv_multipart()
        assert frames[0] == b"kv" and len(frames) == 3 and frames[1] == (0).to_bytes(8, "big")
        ts, events, rank = msgpack.unpackb(frames[2])
        assert ts > 0 and rank == 0 and [e["type"] for e in events] == ["BlockStored"] * 3  # 50 tokens: 3 full blocks
        assert [e["token_ids"] for e in events] == [prompt[i : i + 16] for i in (0, 16, 32)]
        assert events[0]["parent_block_hash"] is None and all(e["block_size"] == 16 for e in events)
        chain = [e["block_hashes"][0] for e in events]
        assert [e["parent_block_hash"] for e in events[1:]] == chain[:-1] and all(0 <= h < 2**64 for h in chain)
        assert set(events[0]) == {"type", "block_hashes", "parent_block_hash", "token_ids", "block_size"} | {
            "lora_id",
            "medium",
            "lora_name",
        }
        # a 100-token prompt takes 7 of the 8 blocks: cached blocks are evicted, each a BlockRemoved of its hash
        client(server.url).completions.create(model="tiny", prompt=_prompts(1, 100, seed=4)[0], max_tokens=1, **GREEDY)
        frames = sub.recv_multipart()
        _, events, _ = msgpack.unpackb(frames[2])
        removed = {h for e in events if e["type"] == "BlockRemoved" for h in e["block_hashes"]}
        stored = [e["block_hashes"][0] for e in events if e["type"] == "BlockStored"]
        assert frames[1] == (1).to_bytes(8, "big") and removed and removed < set(chain) and len(stored) == 6
        # /flush_cache evicts every idle cached block and says so at once
        flushed = urllib.request.urlopen(urllib.request.Request(server.url + "/flush_cache", method="POST"))
        evicted = json.loads(flushed.read())["evicted_blocks"]
        _, events, _ = msgpack.unpackb(sub.recv_multipart()[2])
        gone = {h for e in events for h in e["block_hashes"]}
        assert evicted == len(gone) == 6 + 3 - len(removed) and gone == set(stored) | (set(chain) - removed)
    finally:
        server.stop()
        sub.close(0)
