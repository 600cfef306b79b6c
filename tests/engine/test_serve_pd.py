"""Prefill/decode disaggregation: prefill on cpu_ref, decode on the torch backend, a router in front.

The wire layout round-trips caches (with state, in bfloat16, in blocks that do not divide them);
the gloo link refuses another model and keeps in step past a refused transfer; caches of dense,
MLA and linear-attention models cross backends over it with greedy tokens equal to one engine;
and the three ``hetero serve`` roles answer the openai client like one server, while a pair of
different models is refused at start. Every server is stopped and every wait is bounded."""
from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from _serving import TIMEOUT, Server, client, command_servers, concurrent_streams, get, prompts, with_chat_template  # noqa: E402
from hetero.distributed import free_port  # noqa: E402
from hetero.engine import LLM, SamplingParams  # noqa: E402
from hetero.engine.runtime.cache_io import SequenceCache  # noqa: E402
from hetero.serve.pd.identity import Identity, fingerprint, refusal  # noqa: E402
from hetero.serve.pd.link import KVLinkRefused, connect  # noqa: E402
from hetero.serve.pd.wire import Assembly, header_of, payloads, sizes  # noqa: E402

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


@pytest.mark.parametrize("change, words", [
    (dict(fingerprint="0" * 32), "model fingerprint"),
    (dict(num_tokens=65), "num_tokens must be"),
    (dict(tokens_per_block=0), "tokens_per_block"),
    (dict(token_ids=[1]), "token ids for 5 tokens"),
    (dict(paged=[["a.k", "torch.float32", [2, 3]]]), "paged entries"),
])
def test_a_header_that_does_not_fit_this_instance_is_refused(change, words):
    ident = identity()
    header = dict(header_of(random_cache(ident, 5), "t1", ident, 4), **change)
    with pytest.raises(ValueError, match=f"'t1' refused: .*{words}"):
        Assembly(header, ident, max_tokens=64)


def test_the_fingerprint_sees_other_weights_and_refusal_names_the_difference(checkpoints, tmp_path):
    from hetero.engine import tiny

    a = checkpoints("qwen3")
    copy = tmp_path / "copy"
    shutil.copytree(a, copy)
    other = tiny.build("qwen3", tmp_path / "other", seed=1)
    assert fingerprint(a) == fingerprint(copy) != fingerprint(other)
    mine = identity()
    assert refusal(mine, mine) is None
    assert "serves another model" in refusal(mine, identity(fp="0" * 32))
    assert "holds torch.float32 [2, 3], this decode instance (/m) torch.bfloat16" in \
        refusal(mine, identity(paged=(("a.k", "torch.float32", (2, 3)),)))
    assert "different state cache entries" in refusal(mine, identity(state=()))


def linked(ident_prefill: Identity, ident_decode: Identity, timeout_s: float = 60):
    """Both ends of a link at a free port, connected from two threads: (prefill, decode), or their errors."""
    addr, ends = f"127.0.0.1:{free_port()}", {}

    def join(role, ident):
        try:
            ends[role] = connect(role, addr, ident, timeout_s)
        except Exception as e:  # noqa: BLE001
            ends[role] = e

    threads = [threading.Thread(target=join, args=a) for a in (("decode", ident_decode), ("prefill", ident_prefill))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 30)
    return ends["prefill"], ends["decode"]


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
    import asyncio

    from hetero.serve.engine_loop import EngineLoop
    from hetero.serve.pd.transfer import KVReceiver, KVSender

    path = str(checkpoints(arch))
    ps = prompts(3, seed=7)
    want = offline(path, ps, 8, **DECODE)
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
    p = Server(build_app(prefill, "tiny", PrefillRole(KVSender(pre, 8), CollectorRegistry())))
    d = Server(build_app(decode, "tiny", DecodeRole(KVReceiver(dec, decode.config.max_model_len),
                                                    CollectorRegistry())))
    r = Server(build_router(p.url, d.url))
    yield r, prefill, decode
    for server in (r, p, d):
        server.stop()


def test_the_router_answers_like_one_server(pair, path):
    router, prefill, decode = pair
    c = client(router.url)
    rows = sum(decode.stats["step_tokens"])
    ps = prompts(4, seed=2) + [[7]]  # a one-token prompt ships nothing
    want = offline(path, ps, 10)
    for p, w in zip(ps, want):
        whole = c.completions.create(model="tiny", prompt=p, max_tokens=10, **GREEDY)
        assert whole.choices[0].token_ids == w and whole.usage.prompt_tokens == len(p)
        chunks = list(c.completions.create(model="tiny", prompt=p, max_tokens=10, stream=True, **GREEDY))
        assert [t for ch in chunks for t in ch.choices[0].token_ids] == w
    chat = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi!"}], max_tokens=5,
                                     **GREEDY)
    rendered = prefill.tokenizer.apply_chat_template([{"role": "user", "content": "hi!"}],
                                                     add_generation_prompt=True, tokenize=True)
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


def test_a_bad_request_through_the_router_is_the_instances_400(pair):
    import openai

    c = client(pair[0].url)
    with pytest.raises(openai.BadRequestError, match="vocab_size"):
        c.completions.create(model="tiny", prompt=[5, 100000], max_tokens=3)
    with pytest.raises(openai.BadRequestError, match="not served here"):
        c.completions.create(model="nope", prompt=[5, 6], max_tokens=3)
    assert get(pair[0].url + "/health")[0] == 200


def test_a_client_gone_from_the_router_aborts_the_decode(pair):
    router, prefill, decode = pair
    stream = client(router.url).completions.create(model="tiny", prompt=[9, 8, 7, 6], max_tokens=400, stream=True,
                                                   temperature=0.0, extra_body={"ignore_eos": True})
    next(iter(stream))
    stream.close()
    deadline = time.monotonic() + 60
    while decode.scheduler.has_unfinished():
        assert time.monotonic() < deadline, "the decode request was not aborted"
        time.sleep(0.05)
    assert decode.block_manager.num_used_blocks == 0


def test_the_serve_roles_pair_up_and_a_mismatched_pair_is_refused(path, tmp_path):
    from hetero.engine import tiny

    addr = f"127.0.0.1:{free_port()}"
    base = [sys.executable]
    roles = [(base, ["--model", path, "--backend", "cpu_ref", "--dtype", "float32", "--block-size", "8",
                     "--role", "prefill", "--kv-transfer-addr", addr]),
             (base, ["--model", path, "--backend", "torch", "--dtype", "float32", "--role", "decode",
                     "--kv-transfer-addr", addr, "--served-model-name", "tiny"])]
    with command_servers(roles, 300, 30) as (pre_url, dec_url):
        with command_servers([(base, ["--role", "router", "--prefill-url", pre_url, "--decode-url", dec_url])],
                             120, 30) as (url,):
            c = client(url)
            ps = prompts(3, seed=9)
            got = [c.completions.create(model="tiny", prompt=p, max_tokens=8, **GREEDY).choices[0].token_ids
                   for p in ps]
            assert got == offline(path, ps, 8)
            assert [m.id for m in c.models.list().data] == ["tiny"]
    other = str(tiny.build("qwen3", tmp_path / "other", seed=1))
    addr = f"127.0.0.1:{free_port()}"
    cmd = [sys.executable, "-m", "hetero.cli", "serve", "--backend", "cpu_ref", "--kv-transfer-addr", addr,
           "--kv-connect-timeout", "120"]
    procs = [subprocess.Popen([*cmd, "--model", m, "--role", role, "--port", str(free_port())],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for m, role in ((path, "decode"), (other, "prefill"))]
    try:
        outs = [proc.communicate(timeout=180)[0] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    assert [proc.returncode for proc in procs] == [2, 2], outs
    assert all("refused: the" in out and "serves another model" in out for out in outs), outs
