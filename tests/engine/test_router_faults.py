"""Failover through vllm-router over three hetero instances, with the configuration docs/serving.md gives
(round_robin, health checks every second, one failure marks a worker down, the router's default 5 attempts):

- a soak of hundreds of concurrent requests, streamed and not, a quarter of whose clients leave early,
  answers every request that stayed in full with offline tokens, and leaves every instance with no request
  and every KV block free;
- SIGTERM of an instance under load loses nothing: it drains (new requests 503, which the router retries on
  another instance) while its running requests finish;
- SIGKILL of an instance under load loses no request that is not streamed (the router retries it on another
  instance); a stream it cut ends in an error the client sees, never a hang (vllm-router cuts a relayed
  stream without an error event: its behaviour, measured here)."""

from __future__ import annotations

import asyncio
import functools
import json
import signal
import sys
import threading
import time

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
from _serving import Server, command_servers, get, offline, prompts, router  # noqa: E402

from hetero.distributed import free_port  # noqa: E402
from hetero.engine import LLM  # noqa: E402

ENGINE = dict(backend="cpu_ref", dtype="float32", block_size=16, max_num_seqs=16)
offline = functools.partial(offline, **ENGINE)
GREEDY = dict(temperature=0.0, extra_body={"ignore_eos": True, "return_token_ids": True})
FAILOVER = ("--policy", "round_robin", "--health-failure-threshold", "1")


async def _one(c: openai.AsyncOpenAI, prompt, max_tokens: int, kind: str):
    """``kind``: whole, stream, leave (a stream whose client leaves after its first chunk), or gone (a whole
    request whose client times out at once). The token ids answered, or the exception the client saw."""
    try:
        if kind == "whole":
            r = await c.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens, **GREEDY)
            return r.choices[0].token_ids
        if kind == "gone":
            await c.with_options(timeout=0.05).completions.create(model="tiny", prompt=prompt, max_tokens=400, **GREEDY)
            return None
        stream = await c.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens, stream=True, **GREEDY)
        tokens = []
        async for chunk in stream:
            tokens += chunk.choices[0].token_ids or []
            if kind == "leave":
                await stream.close()
                return None
        return tokens
    except Exception as e:  # noqa: BLE001  (what the client saw: a status, a timeout, a cut connection)
        return e


async def _load(url: str, jobs: list[tuple[list[int], str]], max_tokens: int, concurrency: int, on_started=None):
    c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", timeout=120, max_retries=0)
    gate, started = asyncio.Semaphore(concurrency), [0]

    async def run(prompt, kind):
        async with gate:
            started[0] += 1
            if on_started is not None:
                on_started(started[0])
            return await _one(c, prompt, max_tokens, kind)

    try:
        return await asyncio.wait_for(asyncio.gather(*(run(p, k) for p, k in jobs)), 180)
    finally:
        await c.close()


@pytest.fixture(scope="module")
def path(checkpoints):
    return str(checkpoints("qwen3"))


def test_a_soak_answers_every_staying_request_in_full_and_leaves_every_pool_as_it_started(path):
    from hetero.serve import build_app

    llms = [LLM(path, **ENGINE) for _ in range(3)]
    free = [llm.block_manager.num_free_blocks for llm in llms]
    servers = [Server(build_app(llm, "tiny")) for llm in llms]
    ps = prompts(12, seed=5)
    want = offline(path, ps, 6)
    kinds = ("whole", "stream", "whole", "stream", "leave", "gone", "whole", "stream")
    jobs = [(ps[i % len(ps)], kinds[i % len(kinds)]) for i in range(240)]
    try:
        with router([s.url for s in servers], *FAILOVER) as url:
            got = asyncio.run(_load(url, jobs, 6, concurrency=64))
        for i, ((prompt, kind), answer) in enumerate(zip(jobs, got)):
            if kind in ("whole", "stream"):
                assert answer == want[i % len(ps)], (i, kind, answer)
        deadline = time.monotonic() + 60
        while any(s.app.state.engine.num_requests or llm.scheduler.has_unfinished() for s, llm in zip(servers, llms)):
            assert time.monotonic() < deadline, "requests were left in an engine"
            time.sleep(0.05)
        assert [llm.block_manager.num_used_blocks for llm in llms] == [0, 0, 0]
        assert [llm.block_manager.num_free_blocks for llm in llms] == free
        assert all(llm.stats["generated_tokens"] for llm in llms), "every instance served"
    finally:
        for s in servers:
            s.stop()


def _strike_when_busy(url: str, proc, sig, load: int = 3, delay: float = 0.2) -> threading.Thread:
    """Signal ``proc`` ``delay`` s after its instance at ``url`` holds ``load`` requests (polled every 20 ms)."""

    def watch():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if json.loads(get(url + "/get_load")[1])["load"] >= load:
                    time.sleep(delay)  # their streams under way
                    break
            except OSError:
                pass
            time.sleep(0.02)
        proc.send_signal(sig)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_sigterm_and_sigkill_of_an_instance_under_load_lose_no_request(path):
    base = [sys.executable]
    args = ["--model", path, "--backend", "cpu_ref", "--dtype", "float32", "--served-model-name", "tiny"]
    ps = prompts(8, seed=9)
    want = offline(path, ps, 32)
    with command_servers([(base, args)] * 3, 300, 60) as urls, router(urls, *FAILOVER) as url:
        for sig, victim in ((signal.SIGTERM, 0), (signal.SIGKILL, 1)):
            # a period of 3 over the 2 or 3 instances round robin takes turns on: each gets both kinds
            jobs = [(ps[i % len(ps)], ("whole", "stream", "stream")[i % 3]) for i in range(48)]
            strike = _strike_when_busy(urls[victim], urls.procs[victim], sig)
            got = asyncio.run(_load(url, jobs, 32, concurrency=16))
            strike.join(10)
            assert urls.procs[victim].wait(60) is not None
            for i, ((prompt, kind), answer) in enumerate(zip(jobs, got)):
                if kind == "whole" or sig == signal.SIGTERM:
                    assert answer == want[i % len(ps)], (sig, i, kind, answer)
                else:  # a stream on the killed instance ends with an error the client sees; the rest are whole
                    assert answer == want[i % len(ps)] or isinstance(answer, Exception), (sig, i, answer)


def test_a_prefill_or_decode_instance_killed_in_xpyd_fails_only_what_it_carried(path):
    """2P2D, one prefill and one decode instance in processes of their own (the victims), one of each in this
    process: each kill fails some requests, each with an error the client sees (vllm-router does not retry in
    PD mode), the rest answer in full, and once the router's health check has the victim down, every request
    answers in full again. The survivors end with no request and every block free."""
    from prometheus_client import CollectorRegistry

    from hetero.serve import build_app
    from hetero.serve.pd import open_role

    secret = {"HETERO_KV_LINK_SECRET": "s3cret"}
    model = ["--model", path, "--dtype", "float32", "--served-model-name", "tiny", "--block-size", "16"]
    procs = [
        (
            [sys.executable],
            [*model, "--backend", "cpu_ref", "--role", "prefill", "--kv-transfer-addr", f"127.0.0.1:{free_port()}"],
        ),
        ([sys.executable], [*model, "--backend", "torch", "--role", "decode"]),
    ]
    local = []
    for role, backend in (("prefill", "cpu_ref"), ("decode", "torch")):
        llm = LLM(path, **dict(ENGINE, backend=backend))
        addr = f"127.0.0.1:{free_port()}" if role == "prefill" else None
        local.append(
            (llm, Server(build_app(llm, "tiny", open_role(llm, role, addr, CollectorRegistry(), "s3cret", role))))
        )
    ps = prompts(8, seed=13)
    want = offline(path, ps, 32)
    try:
        with command_servers(procs, 300, 60, env=secret) as urls:
            flags = ["--vllm-pd-disaggregation", "--kv-connector", "nixl", *FAILOVER[2:]]
            flags += ["--prefill-policy", "round_robin", "--decode-policy", "round_robin"]
            flags += [
                "--prefill",
                local[0][1].url,
                "--prefill",
                urls[0],
                "--decode",
                local[1][1].url,
                "--decode",
                urls[1],
            ]
            with router([], *flags) as url:
                for victim, load, delay in ((0, 1, 0.0), (1, 3, 0.2)):
                    jobs = [(ps[i % len(ps)], ("whole", "stream", "stream")[i % 3]) for i in range(24)]
                    strike = _strike_when_busy(urls[victim], urls.procs[victim], signal.SIGKILL, load, delay)
                    got = asyncio.run(_load(url, jobs, 32, concurrency=12))
                    strike.join(10)
                    assert urls.procs[victim].wait(60) is not None
                    for i, answer in enumerate(got):
                        assert answer == want[i % len(ps)] or isinstance(answer, Exception), (victim, i, answer)
                    time.sleep(3)  # the health check (every second, one failure) takes the victim out
                    again = asyncio.run(_load(url, jobs[:8], 32, concurrency=8))
                    assert again == [want[i % len(ps)] for i in range(8)], victim
        for llm, server in local:
            deadline = time.monotonic() + 60
            while server.app.state.engine.num_requests or llm.scheduler.has_unfinished():
                assert time.monotonic() < deadline, "requests were left in a surviving instance"
                time.sleep(0.05)
            assert llm.block_manager.num_used_blocks == 0
    finally:
        for _, server in local:
            server.stop()
