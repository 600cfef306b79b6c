"""xPyD through vLLM's own router (the real ``vllm-router`` binary, ``--vllm-pd-disaggregation`` with the NIXL
request protocol): two prefill instances on cpu_ref and two decode instances on torch, every decode instance
pulling caches from both prefill instances over links it dials itself; the openai client gets one instance's
tokens, whole, streamed and chat. (Instances killed under load in xPyD: ``test_router_faults.py``.)"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
from _serving import (  # noqa: E402
    ROUTER,
    Server,
    client,
    concurrent_streams,
    offline,
    prompts,
    router,
    with_chat_template,
)

from hetero.distributed import free_port  # noqa: E402
from hetero.engine import LLM  # noqa: E402

PREFILL = dict(backend="cpu_ref", dtype="float32", block_size=8, max_num_seqs=16)
DECODE = dict(backend="torch", dtype="float32", block_size=16, max_num_seqs=16)
offline = functools.partial(offline, **DECODE)
GREEDY = dict(temperature=0.0, extra_body={"ignore_eos": True, "return_token_ids": True})


@pytest.fixture(scope="module")
def path(checkpoints, tmp_path_factory):
    return with_chat_template(checkpoints("qwen3"), tmp_path_factory.mktemp("xpyd") / "tiny-qwen3")


@pytest.fixture(scope="module")
def xpyd(path):
    """Two prefill and two decode instances in this process, each pair of them linked on first use."""
    from prometheus_client import CollectorRegistry

    from hetero.serve import build_app
    from hetero.serve.pd import open_role

    if not Path(ROUTER).exists():
        pytest.skip("vllm-router is not installed (pip install 'hetero[serve]')")
    servers, llms = [], {"prefill": [], "decode": []}
    for role, engine in (("prefill", PREFILL), ("prefill", PREFILL), ("decode", DECODE), ("decode", DECODE)):
        llm = LLM(path, **engine)
        addr = f"127.0.0.1:{free_port()}" if role == "prefill" else None
        pd = open_role(llm, role, addr, CollectorRegistry(), "s3cret", f"{role}{len(llms[role])}")
        servers.append(Server(build_app(llm, "tiny", pd)))
        llms[role].append((llm, pd))
    yield servers, llms
    for server in servers:
        server.stop()


def pd_router(prefills, decodes, *options: str):
    flags = ["--vllm-pd-disaggregation", "--kv-connector", "nixl", *options]
    flags += [f for s in prefills for f in ("--prefill", s.url)] + [f for s in decodes for f in ("--decode", s.url)]
    return router([], *flags)


def test_2p2d_through_vllm_router_gives_one_instances_tokens(xpyd, path):
    servers, llms = xpyd
    ps = prompts(8, seed=11)
    want = offline(path, ps, 6)
    rr = ("--prefill-policy", "round_robin", "--decode-policy", "round_robin")
    with pd_router(servers[:2], servers[2:], *rr) as url:
        c = client(url)
        got = [c.completions.create(model="tiny", prompt=p, max_tokens=6, **GREEDY).choices[0].token_ids for p in ps]
        assert got == want
        assert concurrent_streams(c, "tiny", ps, 6) == want
        chat = c.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi!"}], max_tokens=5, **GREEDY
        )
        llm = llms["decode"][0][0]
        ids = llm.tokenizer.apply_chat_template([{"role": "user", "content": "hi!"}], add_generation_prompt=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        assert chat.choices[0].token_ids == offline(path, [ids], 5)[0]
        one = c.completions.create(model="tiny", prompt=[7], max_tokens=4, **GREEDY)  # nothing to ship
        assert one.choices[0].token_ids == offline(path, [[7]], 4)[0]
    with pd_router(servers[:2], servers[:1:-1], *rr) as url:  # round robin in step: now the other pairs
        assert concurrent_streams(client(url), "tiny", ps[:4], 6) == want[:4]
    for llm, pd in llms["prefill"]:
        assert pd.counters.transfers._value.get() > 0, "both prefill instances served"
        assert pd.source.held() == 0 and llm.block_manager.num_used_blocks == 0
    for llm, pd in llms["decode"]:
        assert len(pd.puller.peers) == 2, "each decode instance pulled from both prefill instances"
        assert llm.block_manager.num_used_blocks == 0
