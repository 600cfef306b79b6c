"""The pieces of prefill/decode disaggregation below the HTTP servers: the wire layout, the model
fingerprint and refusal, the gloo link, the sender and receiver threads, and caches of four model
families crossing from cpu_ref to torch over the link with greedy tokens equal to one engine."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _serving import TIMEOUT, pd_ends, prompts
from torch.distributed import PrefixStore, TCPStore

from hetero.distributed import free_port
from hetero.engine import LLM, SamplingParams
from hetero.engine.runtime.cache_io import SequenceCache
from hetero.serve.pd.identity import Identity, fingerprint, refusal
from hetero.serve.pd.link import KVLinkRefused
from hetero.serve.pd.wire import Assembly, header_of, payloads, sizes

PREFILL = dict(backend="cpu_ref", dtype="float32", block_size=8, max_num_seqs=16)
DECODE = dict(backend="torch", dtype="float32", block_size=16, max_num_seqs=16)


def identity(paged=(("a.k", "torch.bfloat16", (2, 3)),), state=(("b.s", "torch.float32", (4,)),), fp="f" * 32):
    return Identity("decode", "/m", fp, tuple(paged), tuple(state))


def random_cache(ident: Identity, n: int, seed: int | None = None) -> SequenceCache:
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    dt = lambda name: getattr(torch, name.removeprefix("torch."))  # noqa: E731
    paged = {name: torch.randn(n, *s, generator=gen).to(dt(d)) for name, d, s in ident.paged}
    state = {name: torch.randn(*s, generator=gen).to(dt(d)) for name, d, s in ident.state}
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
    source, pull = pd_ends(identity(fp="1" * 32), identity(fp="2" * 32), name="other-model")
    with pytest.raises(KVLinkRefused, match="serves another model"):
        pull(source.hold(random_cache(identity(fp="1" * 32), 3)))
    assert (
        source.server.refused[-1].startswith("other-model: it refused")
        and "serves another model" in source.server.refused[-1]
    )


def test_a_peer_without_the_secret_is_refused_by_name_and_both_go_on_serving():
    from hetero.serve.pd.transfer import KVPuller

    ident = identity()
    source, stranger = pd_ends(ident, ident, secret="s3cret", decode_secret="guess", name="stranger")
    srv, cache = source.server, random_cache(ident, 5)
    transfer = source.hold(cache)
    with pytest.raises(
        KVLinkRefused, match="to the prefill instance at .* refused: it does not hold this link's secret"
    ):
        stranger(transfer)
    assert srv.refused[-1].startswith("stranger: ") and "secret" in srv.refused[-1]
    client = TCPStore(srv.host, srv.port, None, False)
    raw = PrefixStore(f"kv/{client.add('kv/pairs', 1)}", client)
    raw.set("hello", json.dumps({"name": "raw", "nonce": "n", "identity": ident.to_json().decode()}))
    raw.wait(["welcome"])  # a stranger that skips checking the prefill side and answers with a forged proof
    raw.set("proof", json.dumps({"proof": "0" * 64, "refused": None}))
    raw.wait(["verdict"])
    assert "does not hold this link's secret" in raw.get("verdict").decode() and srv.refused[-1].startswith("raw: ")
    with pytest.raises(KVLinkRefused, match="secret"):  # no secret at all is no better
        asyncio.run(KVPuller(ident, None, 64, "nobody").pull(srv.host, srv.port, srv.engine_id, transfer))
    assert srv.refused[-1].startswith("nobody: ")
    friend = KVPuller(ident, "s3cret", 64, "friend")
    assert torch.equal(
        asyncio.run(friend.pull(srv.host, srv.port, srv.engine_id, transfer)).paged["a.k"], cache.paged["a.k"]
    )
    own, _ = pd_ends(ident, ident, secret="guess")  # the refused instance goes on pulling from its own peers
    mine = own.hold(cache)
    own_srv = own.server
    got = asyncio.run(stranger.puller.pull(own_srv.host, own_srv.port, own_srv.engine_id, mine))
    assert torch.equal(got.state["b.s"], cache.state["b.s"])


def test_pulls_keep_in_step_past_refused_and_missing_transfers():
    ident = identity()
    source, pull = pd_ends(ident, ident)
    caches = [random_cache(ident, 9), random_cache(ident, 70), random_cache(ident, 3)]
    ids = [source.hold(c) for c in caches]
    assert torch.equal(pull(ids[0]).paged["a.k"], caches[0].paged["a.k"])
    with pytest.raises(ValueError, match="refused: num_tokens"):  # 70 tokens: more than this instance takes
        pull(ids[1])
    with pytest.raises(LookupError, match="holds no KV transfer"):
        pull("nope")
    with pytest.raises(LookupError, match="holds no KV transfer"):  # a cache is pulled once
        pull(ids[0])
    got = pull(ids[2])
    assert torch.equal(got.paged["a.k"], caches[2].paged["a.k"]) and torch.equal(
        got.state["b.s"], caches[2].state["b.s"]
    )
    assert source.held() == 0 and len(pull.puller.peers) == 1, "one link served every pull"


@pytest.mark.parametrize("arch", ["qwen3", "deepseek_v3", "deepseek_v32", "qwen3_5"])
def test_caches_cross_backends_over_the_link_with_equal_tokens(arch, checkpoints):
    """Dense KV, the MLA latent (with DSA's indexer keys) and the linear-attention state, exported on
    cpu_ref, imported on torch."""
    from hetero.serve.engine_loop import EngineLoop

    path = str(checkpoints(arch))
    ps = prompts(3, seed=7)
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    want = [o.token_ids for o in LLM(path, **DECODE).generate(ps, greedy, progress=False)]
    prefill, decode = LLM(path, **PREFILL), LLM(path, **DECODE)
    source, pull = pd_ends(Identity.of(prefill, "prefill"), Identity.of(decode, "decode"), max_tokens=512)
    exporter = EngineLoop(prefill)

    async def export():
        out = []
        for p in ps:
            cache = await exporter.export(p[:-1])
            assert bool(cache.state) == (arch == "qwen3_5") and cache.num_tokens == len(p) - 1
            out.append(source.hold(cache))
        return out

    exporter.start()
    try:
        ids = asyncio.run(asyncio.wait_for(export(), TIMEOUT))
    finally:
        exporter.stop()
    for i, (p, transfer) in enumerate(zip(ps, ids)):
        decode.add_request(p, greedy, f"r{i}", cache=pull(transfer))
    done = {}
    while decode.has_unfinished():
        done.update((o.request_id, o.token_ids) for o in decode.step() if o.finished)
    assert [done[f"r{i}"] for i in range(3)] == want
    assert sum(decode.stats["step_tokens"]) == 3 * 8, "decode computed only each last prompt token and the outputs"
    assert prefill.block_manager.num_used_blocks == 0, "the exported requests were ended"
    assert decode.stats["prompt_tokens"] == sum(map(len, ps))


def test_a_cache_nobody_pulls_is_dropped():
    ident = identity()
    source, pull = pd_ends(ident, ident, unclaimed_s=5.0)
    now = time.monotonic()
    ids = [source.hold(random_cache(ident, 3)) for _ in range(3)]
    for transfer, age in zip(ids, (6.0, 1.0, 0.0)):
        source._held[transfer] = (now - age, source._held[transfer][1])
    assert source.drop_stale(now) == ids[:1] and source.held() == 2
    with pytest.raises(LookupError, match="holds no KV transfer"):
        pull(ids[0])
    assert pull(ids[1]).num_tokens == 3


def test_a_link_that_breaks_fails_its_pull_only_and_the_next_pull_dials_again(monkeypatch):
    ident = identity()
    source, pull = pd_ends(ident, ident)
    cache = random_cache(ident, 9)
    pull(source.hold(cache))
    (peer,) = pull.puller.peers.values()

    def broken(header, window=4):
        raise RuntimeError("planted: the link broke")

    monkeypatch.setattr(peer.link, "recv_payloads", broken)
    with pytest.raises(ConnectionError, match="planted"):
        pull(source.hold(cache))
    assert torch.equal(pull(source.hold(cache)).paged["a.k"], cache.paged["a.k"])
    assert list(pull.puller.peers.values())[0] is not peer, "the broken link was replaced"


def test_a_killed_prefill_instance_fails_its_pulls_and_its_restart_is_dialed_again(tmp_path):
    """A prefill instance in another process, SIGKILLed, then started again on the same port."""
    ident = identity()
    port = free_port()
    _, pull = pd_ends(ident, ident)
    local, _ = pd_ends(ident, ident)  # another prefill instance, which the death must not touch
    puller = pull.puller

    def start():
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("_kv_source.py")), str(port)],
            stdout=subprocess.PIPE,
            text=True,
        )
        return proc, json.loads(proc.stdout.readline())

    proc, first = start()
    try:
        got = asyncio.run(puller.pull("127.0.0.1", port, first["engine"], first["ids"][0]))
        assert torch.equal(got.paged["a.k"], random_cache(ident, 6, seed=0).paged["a.k"])
        proc.kill()
        proc.wait(30)
        proc, second = start()  # restarted while the decode side was idle: its next pull dials the new one
        assert second["engine"] != first["engine"]
        got = asyncio.run(puller.pull("127.0.0.1", port, second["engine"], second["ids"][1]))
        assert torch.equal(got.paged["a.k"], random_cache(ident, 6, seed=1).paged["a.k"])
        with pytest.raises(LookupError, match="restarted"):  # a transfer of the killed incarnation
            asyncio.run(puller.pull("127.0.0.1", port, first["engine"], first["ids"][1]))
        proc.kill()
        proc.wait(30)
        with pytest.raises(ConnectionError):
            asyncio.run(puller.pull("127.0.0.1", port, second["engine"], second["ids"][0]))
        mine, srv = random_cache(ident, 4), local.server  # the other prefill instance serves on
        got = asyncio.run(puller.pull(srv.host, srv.port, srv.engine_id, local.hold(mine)))
        assert torch.equal(got.paged["a.k"], mine.paged["a.k"])
    finally:
        proc.kill()
