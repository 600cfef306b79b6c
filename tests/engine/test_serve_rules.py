"""The rules of ``hetero serve`` one function at a time, without a model or a socket (test_serve.py and
test_serve_pd.py run the real servers): metrics arithmetic, stop strings, request checks, the engine
thread's abort and export, waiting on a client that may leave, the router's relay of a refusal, and the
KV link's address, identity and unclaimed-cache rules."""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("fastapi")

from hetero.engine import SamplingParams  # noqa: E402
from hetero.engine.outputs import RequestOutput  # noqa: E402
from hetero.errors import UsageError  # noqa: E402
from hetero.serve import app as app_module  # noqa: E402
from hetero.serve._choices import Choice, ChoiceStream  # noqa: E402
from hetero.serve._disconnect import ClientGone, unless_gone  # noqa: E402
from hetero.serve.engine_loop import EngineLoop  # noqa: E402
from hetero.serve.metrics import ServerMetrics  # noqa: E402
from hetero.serve.pd.identity import Identity, fingerprint, refusal  # noqa: E402
from hetero.serve.pd.link import parse_addr  # noqa: E402


def _out(rid="r", tokens=(), new=(), reason=None, **metrics) -> RequestOutput:
    return RequestOutput(rid, [1, 2, 3], list(tokens), None, reason, dict(metrics), list(new))


# ---------------------------------------------------------------- metrics


def _llm(preemptions: int) -> SimpleNamespace:
    scheduler = SimpleNamespace(running=[1], waiting=[])
    return SimpleNamespace(
        scheduler=scheduler,
        stats={"num_kv_blocks": 8, "preemptions": preemptions},
        block_manager=SimpleNamespace(num_used_blocks=2),
    )


def test_tpot_is_the_time_after_the_first_token_over_the_tokens_after_it():
    m = ServerMetrics("m")
    done = _out(
        tokens=[5, 6, 7, 8, 9], new=[9], reason="length", arrival_time=10.0, first_token_time=10.5, finish_time=12.5
    )
    m.on_step(_llm(0), [done])
    value = lambda name: m.registry.get_sample_value(name, {"model_name": "m"})  # noqa: E731
    assert value("hetero_time_to_first_token_seconds_sum") == pytest.approx(0.5)
    assert value("hetero_time_per_output_token_seconds_sum") == pytest.approx(2.0 / 4)
    assert value("hetero_prompt_tokens_total") == 3 and value("hetero_generation_tokens_total") == 1
    assert value("hetero_kv_cache_usage_perc") == 0.25


def test_preemptions_count_each_once_across_steps():
    m = ServerMetrics("m")
    for total in (0, 2, 2, 5):  # the engine's running total after each step
        m.on_step(_llm(total), [])
    assert m.registry.get_sample_value("hetero_num_preemptions_total", {"model_name": "m"}) == 5


# ---------------------------------------------------------------- stop strings and request checks


class _Chars:
    """A tokenizer whose token i is the character chr(i)."""

    @staticmethod
    def decode(ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


def _ids(text: str) -> list[int]:
    return [ord(c) for c in text]


@pytest.mark.parametrize(
    "text, stop, want",
    [
        ("hello world. bye", ["bye", "."], ("hello world", True)),  # the first of two stop strings cuts
        ("hello world. bye", [".", "bye"], ("hello world", True)),
        ("stop right there", ["stop"], ("", True)),  # a stop string at the very start
        ("no stops here", ["xyz"], ("no stops here", False)),
    ],
)
def test_text_is_cut_before_the_first_stop_string(text, stop, want):
    assert Choice(_Chars(), stop, False, False).text(_ids(text)) == want


def test_a_stream_cut_by_a_stop_string_sends_only_the_text_before_it():
    stream = ChoiceStream(Choice(_Chars(), ["END"], True, False), chat=False)
    chunks = [stream.delta(_out(new=_ids(part))) for part in ("abc", "dE", "NDxy")]
    assert "".join(c["text"] for c in chunks if c) == "abcd" and stream.done and stream.finish_reason == "stop"


@pytest.mark.parametrize("n", [0, 2])
def test_n_other_than_one_is_refused(n):
    body = SimpleNamespace(model=None, n=n, stop=None)
    with pytest.raises(app_module.BadRequest, match="n must be 1"):
        app_module._check_common(body, SimpleNamespace(tokenizer=None), "m", False)


# ---------------------------------------------------------------- the engine thread


class _FakeLLM:
    """Each step gives every request one token; a request ends after ``max_tokens`` of them."""

    def __init__(self):
        self.runner = SimpleNamespace(parallel=SimpleNamespace(size=1))
        self.world, self.pipeline = SimpleNamespace(size=1), None  # one process: no followers, no pipeline
        self.scheduler = SimpleNamespace(has_unfinished=lambda: bool(self.requests))
        self.requests: dict[str, list] = {}
        self.aborted: list[str] = []

    def add_request(self, prompt, params, request_id, cache=None):
        self.requests[request_id] = [list(prompt), [], params.max_tokens]

    def step(self):
        time.sleep(0.002)  # a step takes time: a long request is still running when its abort comes
        outs = []
        for rid, (prompt, tokens, limit) in list(self.requests.items()):
            tokens.append(len(tokens) + 100)
            done = len(tokens) >= limit
            outs.append(RequestOutput(rid, prompt, list(tokens), None, "length" if done else None, {}, [tokens[-1]]))
            if done:
                del self.requests[rid]
        return outs

    def abort(self, rid):
        self.aborted.append(rid)
        self.requests.pop(rid, None)

    def export_cache(self, rid):
        return ("cache of", rid, tuple(self.requests[rid][0]))


def _serving(body):
    llm = _FakeLLM()
    loop = EngineLoop(llm)
    loop.start()
    try:
        return llm, asyncio.run(asyncio.wait_for(body(loop, llm), 10))
    finally:
        loop.stop()


def test_a_stream_closed_early_aborts_its_request_and_a_finished_one_is_not_aborted():
    async def body(loop, llm):
        whole = [o async for o in loop.generate([1, 2], SamplingParams(max_tokens=3, ignore_eos=True))]
        stream = loop.generate([1, 2], SamplingParams(max_tokens=10**6, ignore_eos=True))
        first = await anext(stream)
        await stream.aclose()
        for _ in range(200):
            if first.request_id in llm.aborted:
                break
            await asyncio.sleep(0.01)
        return whole, first

    llm, (whole, first) = _serving(body)
    assert [o.finished for o in whole] == [False, False, True] and whole[-1].token_ids == [100, 101, 102]
    assert llm.aborted == [first.request_id] and not llm.requests


def test_export_hands_back_the_cache_of_the_computed_prompt_and_ends_the_request():
    async def body(loop, llm):
        return await loop.export([7, 8, 9])

    llm, cache = _serving(body)
    assert cache[0] == "cache of" and cache[2] == (7, 8, 9)
    assert llm.aborted == [cache[1]] and not llm.requests


# ---------------------------------------------------------------- a client that may leave


class _Request:
    def __init__(self, messages):
        self.messages = messages

    async def receive(self):
        if not self.messages:
            await asyncio.sleep(3600)
        return self.messages.pop(0)


async def _work(seconds: float, cancelled: list):
    try:
        await asyncio.sleep(seconds)
        return "done"
    except asyncio.CancelledError:
        cancelled.append(True)
        raise


def test_unless_gone_returns_the_work_while_the_client_stays():
    cancelled: list = []
    got = asyncio.run(asyncio.wait_for(unless_gone(_Request([{"type": "http.request"}]), _work(0.01, cancelled)), 5))
    assert got == "done" and not cancelled


def test_unless_gone_cancels_the_work_as_soon_as_the_client_leaves():
    cancelled: list = []

    async def body():
        with pytest.raises(ClientGone):
            await unless_gone(_Request([{"type": "http.disconnect"}]), _work(30, cancelled))

    asyncio.run(asyncio.wait_for(body(), 5))
    assert cancelled == [True]


# ---------------------------------------------------------------- the router


# ---------------------------------------------------------------- the KV link


@pytest.mark.parametrize(
    "addr, want",
    [("node1:29500", ("node1", 29500)), ("fe80::1:29500", ("fe80::1", 29500)), ("10.0.0.2:65535", ("10.0.0.2", 65535))],
)
def test_an_address_is_split_at_its_last_colon(addr, want):
    assert parse_addr(addr) == want


@pytest.mark.parametrize("addr", ["node1", "node1:", ":29500", "node1:65536", "node1:0", "node1:x"])
def test_a_bad_address_is_refused(addr):
    with pytest.raises(UsageError, match="HOST:PORT"):
        parse_addr(addr)


def _checkpoint(root, data: torch.Tensor):
    from safetensors.torch import save_file

    root.mkdir(exist_ok=True)
    (root / "config.json").write_text(json.dumps({"model_type": "toy"}))
    save_file({"w": data}, str(root / "model.safetensors"))
    return root


@pytest.mark.parametrize("where", [0, 500, 999])
def test_a_weight_changed_at_its_start_middle_or_end_changes_the_fingerprint(tmp_path, where):
    data = torch.arange(1000, dtype=torch.float32)
    changed = data.clone()
    changed[where] = -1.0
    assert fingerprint(_checkpoint(tmp_path / "a", data)) != fingerprint(_checkpoint(tmp_path / "b", changed))
    assert fingerprint(_checkpoint(tmp_path / "c", data.clone())) == fingerprint(tmp_path / "a")


def test_instances_of_other_block_sizes_and_pool_sizes_accept_each_other(tmp_path):
    model = _checkpoint(tmp_path / "m", torch.zeros(4))

    def identity(role, blocks, block_size):
        paged = {name: torch.empty(blocks, block_size, 2, 8) for name in ("k", "v")}
        cache = SimpleNamespace(paged=paged, state={"s": torch.empty(3, 4, 4)}, shards={})
        runner = SimpleNamespace(cache=cache, parallel=SimpleNamespace(size=1))
        return Identity.of(SimpleNamespace(runner=runner, config=SimpleNamespace(model=str(model))), role)

    prefill, decode = identity("prefill", 100, 16), identity("decode", 37, 4)
    assert prefill.paged == (("k", "torch.float32", (2, 8)), ("v", "torch.float32", (2, 8)))
    assert refusal(decode, prefill) is None and refusal(prefill, decode) is None
