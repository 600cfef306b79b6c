"""Prefill/decode disaggregation served: prefill on cpu_ref, decode on the torch backend, vllm-router's PD
mode in front. Through the router the openai client gets one instance's tokens (whole, streamed, chat,
concurrent), bad requests are the instances' 400s and leave no cache behind, prompts at the length
limit answer as one server does, and a client that leaves aborts the decode. The three ``hetero
serve`` roles pair up as processes, and a decode instance refuses the cache of another model's prefill
instance (a 503 naming why), both going on serving. Every
server is stopped and every wait is bounded. (The link itself: ``test_pd_link.py``.)"""

from __future__ import annotations

import functools
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from _serving import (  # noqa: E402
    ROUTER,
    Server,
    client,
    command_servers,
    concurrent_streams,
    get,
    leave_a_whole_request,
    offline,
    prompts,
    router,
    wait_aborted,
    with_chat_template,
)

from hetero.distributed import free_port  # noqa: E402
from hetero.engine import LLM  # noqa: E402

PREFILL = dict(backend="cpu_ref", dtype="float32", block_size=8, max_num_seqs=16)
offline = functools.partial(offline, **PREFILL)
DECODE = dict(backend="torch", dtype="float32", block_size=16, max_num_seqs=16)
GREEDY = dict(temperature=0.0, extra_body={"ignore_eos": True, "return_token_ids": True})
PD = ("--vllm-pd-disaggregation", "--kv-connector", "nixl")


@pytest.fixture(scope="module")
def path(checkpoints, tmp_path_factory):
    """The tiny Qwen3 with its char-level tokenizer and a plain chat template."""
    return with_chat_template(checkpoints("qwen3"), tmp_path_factory.mktemp("pd") / "tiny-qwen3")


@pytest.fixture(scope="module")
def pair(path):
    """prefill (cpu_ref) and decode (torch) apps in this process, and vllm-router's PD mode in front."""
    from prometheus_client import CollectorRegistry

    from hetero.serve import build_app
    from hetero.serve.pd import open_role

    if not Path(ROUTER).exists():
        pytest.skip("vllm-router is not installed (pip install 'hetero[serve]')")
    prefill, decode = LLM(path, **PREFILL), LLM(path, **DECODE)
    pre = open_role(prefill, "prefill", f"127.0.0.1:{free_port()}", CollectorRegistry(), "s", "p")
    p = Server(build_app(prefill, "tiny", pre))
    d = Server(build_app(decode, "tiny", open_role(decode, "decode", None, CollectorRegistry(), "s", "d")))
    with router([], *PD, "--prefill", p.url, "--decode", d.url) as url:
        yield SimpleNamespace(url=url, port=int(url.rsplit(":", 1)[1])), prefill, decode, pre.source
    for server in (p, d):
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
    router, prefill, decode, source = pair
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
        assert refused.value.code in (400, 422)  # the instances' 400, or vllm-router's own schema check's 422
    assert not source.held(), "a refused request left its cache on the prefill instance"
    assert get(router.url + "/health")[0] == 200


def test_prompts_at_the_length_limit_answer_as_one_server(pair, path):
    router, prefill, decode, source = pair
    c = client(router.url)
    limit = decode.config.max_model_len
    assert prefill.config.max_model_len == limit
    for n in (limit - 1, limit):
        prompt = (prompts(1, seed=n)[0] * limit)[:n]
        got = c.completions.create(model="tiny", prompt=prompt, max_tokens=3, **GREEDY).choices[0]
        assert got.token_ids == offline(path, [prompt], 3)[0] and got.finish_reason == "length"
    with pytest.raises(openai.BadRequestError, match=f"longer than|{limit + 1}"):
        c.completions.create(model="tiny", prompt=[5] * (limit + 1), max_tokens=3)
    assert not source.held() and prefill.block_manager.num_used_blocks == 0


def test_a_client_gone_from_the_router_aborts_the_decode(pair):
    router, prefill, decode, _ = pair
    stream = client(router.url).completions.create(
        model="tiny", prompt=[9, 8, 7, 6], max_tokens=400, stream=True, temperature=0.0, extra_body={"ignore_eos": True}
    )
    next(iter(stream))
    stream.close()
    wait_aborted(decode, "the decode request was not aborted")
    assert decode.block_manager.num_used_blocks == 0


def post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        url, method="POST", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_serve_roles_pair_up_and_a_mismatched_pair_is_refused(path, tmp_path):
    from hetero.tools import tiny

    other = str(tiny.build("qwen3", tmp_path / "other", seed=1))
    base, common = [sys.executable], ["--dtype", "float32", "--served-model-name", "tiny"]
    addr, other_addr = (f"127.0.0.1:{free_port()}" for _ in range(2))
    prefill = ["--backend", "cpu_ref", "--block-size", "8", "--role", "prefill", "--kv-transfer-addr"]
    roles = [
        (base, ["--model", path, *common, *prefill, addr]),
        (base, ["--model", path, *common, "--backend", "torch", "--role", "decode"]),
        (base, ["--model", other, *common, *prefill, other_addr]),
    ]
    with command_servers(roles, 300, 30, env={"HETERO_KV_LINK_SECRET": "s3cret"}) as (pre_url, dec_url, other_url):
        with router([], *PD, "--prefill", pre_url, "--decode", dec_url) as url:
            c = client(url)
            ps = prompts(3, seed=9)
            got = [
                c.completions.create(model="tiny", prompt=p, max_tokens=8, **GREEDY).choices[0].token_ids for p in ps
            ]
            assert got == offline(path, ps, 8)
            assert [m.id for m in c.models.list().data] == ["tiny"]
        ask = {"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 4}
        status, answer = post(other_url + "/v1/completions", dict(ask, kv_transfer_params={"do_remote_decode": True}))
        assert status == 200 and answer["kv_transfer_params"]["do_remote_prefill"], answer
        status, refused = post(dec_url + "/v1/completions", dict(ask, kv_transfer_params=answer["kv_transfer_params"]))
        assert status == 503 and "serves another model" in refused["error"]["message"], refused
        assert get(dec_url + "/health")[0] == 200 and get(other_url + "/health")[0] == 200


def test_a_client_gone_from_a_whole_request_through_the_router_aborts_the_decode(pair):
    router, prefill, decode, _ = pair
    before = decode.stats["generated_tokens"]
    leave_a_whole_request(router.port, decode, "the request never reached the decode instance")
    wait_aborted(decode, "the decode request was not aborted")
    assert decode.block_manager.num_used_blocks == 0 and decode.stats["generated_tokens"] - before < 400


def test_tp2_and_tp1_instances_pair_up_both_ways(path):
    """Served: a TP=2 prefill instance (torchrun) with a TP=1 decode instance, and a TP=1 prefill instance with a
    TP=2 decode instance, behind one vllm-router whose round robin pairs them so; one instance's tokens."""
    from prometheus_client import CollectorRegistry

    from hetero.serve import build_app
    from hetero.serve.pd import open_role

    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
    model = ["--model", path, "--dtype", "float32", "--served-model-name", "tiny", "--tensor-parallel-size", "2"]
    addr = f"127.0.0.1:{free_port()}"
    tp2 = [
        (
            [*launcher, "--master-port", str(free_port())],
            [*model, "--backend", "cpu_ref", "--role", "prefill", "--kv-transfer-addr", addr],
        ),
        ([*launcher, "--master-port", str(free_port())], [*model, "--backend", "torch", "--role", "decode"]),
    ]
    prefill, decode = LLM(path, **PREFILL), LLM(path, **DECODE)
    pre = Server(
        build_app(
            prefill, "tiny", open_role(prefill, "prefill", f"127.0.0.1:{free_port()}", CollectorRegistry(), None, "p1")
        )
    )
    dec = Server(build_app(decode, "tiny", open_role(decode, "decode", None, CollectorRegistry(), None, "d1")))
    ps = prompts(4, seed=17)
    want = offline(path, ps, 6)
    try:
        with command_servers(tp2, 300, 60, env={"OMP_NUM_THREADS": "1"}) as (pre2, dec2):
            rr = ("--prefill-policy", "round_robin", "--decode-policy", "round_robin")
            with router(
                [], *PD, *rr, "--prefill", pre2, "--prefill", pre.url, "--decode", dec.url, "--decode", dec2
            ) as url:
                c = client(url)
                got = [
                    c.completions.create(model="tiny", prompt=p, max_tokens=6, **GREEDY).choices[0].token_ids
                    for p in ps
                ]
                assert got == want
        assert prefill.stats["prompt_tokens"] and decode.stats["prompt_tokens"], "both crossings ran"
    finally:
        pre.stop()
        dec.stop()
