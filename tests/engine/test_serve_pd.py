"""Prefill/decode disaggregation served: prefill on cpu_ref, decode on the torch backend, a router in
front. Through the router the openai client gets one instance's tokens (whole, streamed, chat,
concurrent), bad requests are the instances' 400s and leave no cache behind, prompts at the length
limit answer as one server does, and a client that leaves aborts the decode. The three ``hetero
serve`` roles pair up as processes, and a pair of different models is refused at start. Every
server is stopped and every wait is bounded. (The link itself: ``test_pd_link.py``.)"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from _serving import (  # noqa: E402
    Server,
    client,
    command_servers,
    concurrent_streams,
    get,
    leave_a_whole_request,
    linked,
    prompts,
    wait_aborted,
    with_chat_template,
)

from hetero.distributed import free_port  # noqa: E402
from hetero.engine import LLM, SamplingParams  # noqa: E402
from hetero.serve.pd.identity import Identity  # noqa: E402

PREFILL = dict(backend="cpu_ref", dtype="float32", block_size=8, max_num_seqs=16)
DECODE = dict(backend="torch", dtype="float32", block_size=16, max_num_seqs=16)
GREEDY = dict(temperature=0.0, extra_body={"ignore_eos": True, "return_token_ids": True})


@pytest.fixture(scope="module")
def path(checkpoints, tmp_path_factory):
    """The tiny Qwen3 with its char-level tokenizer and a plain chat template."""
    return with_chat_template(checkpoints("qwen3"), tmp_path_factory.mktemp("pd") / "tiny-qwen3")


def offline(path, prompt_list, max_tokens: int, **engine) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [o.token_ids for o in LLM(path, **(engine or PREFILL)).generate(prompt_list, params, progress=False)]


@pytest.fixture(scope="module")
def pair(path):
    """prefill (cpu_ref) and decode (torch) apps in this process, their link, and a router."""
    from prometheus_client import CollectorRegistry

    from hetero.serve import build_app
    from hetero.serve.pd.roles import DecodeRole, PrefillRole
    from hetero.serve.pd.router import build_router
    from hetero.serve.pd.transfer import KVReceiver, KVSender

    prefill, decode = LLM(path, **PREFILL), LLM(path, **DECODE)
    pre, dec = linked(Identity.of(prefill, "prefill"), Identity.of(decode, "decode"))
    receiver = KVReceiver(dec, decode.config.max_model_len)
    p = Server(build_app(prefill, "tiny", PrefillRole(KVSender(pre, 8), CollectorRegistry())))
    d = Server(build_app(decode, "tiny", DecodeRole(receiver, CollectorRegistry())))
    r = Server(build_router(p.url, d.url))
    yield r, prefill, decode, receiver
    for server in (r, p, d):
        server.stop()


def test_the_router_answers_like_one_server(pair, path):
    router, prefill, decode, _ = pair
    c = client(router.url)
    rows = sum(decode.stats["step_tokens"])
    ps = prompts(4, seed=2) + [[7]]  # a one-token prompt ships nothing
    want = offline(path, ps, 10)
    for p, w in zip(ps, want):
        whole = c.completions.create(model="tiny", prompt=p, max_tokens=10, **GREEDY)
        assert whole.choices[0].token_ids == w and whole.usage.prompt_tokens == len(p)
        chunks = list(c.completions.create(model="tiny", prompt=p, max_tokens=10, stream=True, **GREEDY))
        assert [t for ch in chunks for t in ch.choices[0].token_ids] == w
    chat = c.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi!"}], max_tokens=5, **GREEDY
    )
    rendered = prefill.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi!"}], add_generation_prompt=True, tokenize=True
    )
    rendered = list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)
    assert chat.choices[0].token_ids == offline(path, [rendered], 5)[0]
    assert decode.stats["prompt_tokens"] == 2 * sum(map(len, ps)) + len(rendered)
    # each request's last prompt token and its outputs but the last: the rest of the prompt came over the link
    assert sum(decode.stats["step_tokens"]) - rows == 2 * len(ps) * 10 + 5
    assert prefill.block_manager.num_used_blocks == 0


def test_the_router_serves_concurrent_streams(pair, path):
    c = client(pair[0].url)
    ps = prompts(12, seed=4)
    assert concurrent_streams(c, "tiny", ps, 6) == offline(path, ps, 6)


def test_a_bad_request_through_the_router_is_the_instances_400_and_leaves_nothing(pair):
    router, prefill, decode, receiver = pair
    c = client(router.url)
    computed = prefill.stats["prompt_tokens"]
    with pytest.raises(openai.BadRequestError, match="vocab_size"):
        c.completions.create(model="tiny", prompt=[5, 100000], max_tokens=3)
    with pytest.raises(openai.BadRequestError, match="seed"):
        c.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=3, seed=-1)
    assert prefill.stats["prompt_tokens"] == computed, "the prefill instance computed a refused request"
    with pytest.raises(openai.BadRequestError, match="not served here"):  # the decode instance refuses this one
        c.completions.create(model="nope", prompt=[5, 6, 7], max_tokens=3)
    for odd in ({"model": 123}, {"stream": "sometimes"}):  # the schema: both instances refuse these alike
        req = urllib.request.Request(
            router.url + "/v1/completions",
            method="POST",
            data=json.dumps({"prompt": [5, 6, 7], "max_tokens": 3, **odd}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=30)
        assert refused.value.code == 400
    assert not receiver._ready, "a refused request left its cache on the decode instance"
    assert get(router.url + "/health")[0] == 200


def test_prompts_at_the_length_limit_answer_as_one_server(pair, path):
    router, prefill, decode, receiver = pair
    c = client(router.url)
    limit = decode.config.max_model_len
    assert prefill.config.max_model_len == limit
    for n in (limit - 1, limit):
        prompt = (prompts(1, seed=n)[0] * limit)[:n]
        got = c.completions.create(model="tiny", prompt=prompt, max_tokens=3, **GREEDY).choices[0]
        assert got.token_ids == offline(path, [prompt], 3)[0] and got.finish_reason == "length"
    with pytest.raises(openai.BadRequestError, match=f"longer than|{limit + 1}"):
        c.completions.create(model="tiny", prompt=[5] * (limit + 1), max_tokens=3)
    assert not receiver._ready and prefill.block_manager.num_used_blocks == 0


def test_a_client_gone_from_the_router_aborts_the_decode(pair):
    router, prefill, decode, _ = pair
    stream = client(router.url).completions.create(
        model="tiny", prompt=[9, 8, 7, 6], max_tokens=400, stream=True, temperature=0.0, extra_body={"ignore_eos": True}
    )
    next(iter(stream))
    stream.close()
    wait_aborted(decode, "the decode request was not aborted")
    assert decode.block_manager.num_used_blocks == 0


def test_the_serve_roles_pair_up_and_a_mismatched_pair_is_refused(path, tmp_path):
    from hetero.tools import tiny

    addr = f"127.0.0.1:{free_port()}"
    base = [sys.executable]
    roles = [
        (
            base,
            [
                "--model",
                path,
                "--backend",
                "cpu_ref",
                "--dtype",
                "float32",
                "--block-size",
                "8",
                "--role",
                "prefill",
                "--kv-transfer-addr",
                addr,
            ],
        ),
        (
            base,
            [
                "--model",
                path,
                "--backend",
                "torch",
                "--dtype",
                "float32",
                "--role",
                "decode",
                "--kv-transfer-addr",
                addr,
                "--served-model-name",
                "tiny",
            ],
        ),
    ]
    with command_servers(roles, 300, 30) as (pre_url, dec_url):
        with command_servers(
            [(base, ["--role", "router", "--prefill-url", pre_url, "--decode-url", dec_url])], 120, 30
        ) as (url,):
            c = client(url)
            ps = prompts(3, seed=9)
            got = [
                c.completions.create(model="tiny", prompt=p, max_tokens=8, **GREEDY).choices[0].token_ids for p in ps
            ]
            assert got == offline(path, ps, 8)
            assert [m.id for m in c.models.list().data] == ["tiny"]
    other = str(tiny.build("qwen3", tmp_path / "other", seed=1))
    addr = f"127.0.0.1:{free_port()}"
    cmd = [
        sys.executable,
        "-m",
        "hetero.cli",
        "serve",
        "--backend",
        "cpu_ref",
        "--kv-transfer-addr",
        addr,
        "--kv-connect-timeout",
        "120",
    ]
    procs = [
        subprocess.Popen(
            [*cmd, "--model", m, "--role", role, "--port", str(free_port())],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for m, role in ((path, "decode"), (other, "prefill"))
    ]
    try:
        outs = [proc.communicate(timeout=180)[0] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    assert [proc.returncode for proc in procs] == [2, 2], outs
    assert all("refused: the" in out and "serves another model" in out for out in outs), outs


def test_a_client_gone_from_a_whole_request_through_the_router_aborts_the_decode(pair):
    router, prefill, decode, _ = pair
    before = decode.stats["generated_tokens"]
    leave_a_whole_request(router.port, decode, "the request never reached the decode instance")
    wait_aborted(decode, "the decode request was not aborted")
    assert decode.block_manager.num_used_blocks == 0 and decode.stats["generated_tokens"] - before < 400
