"""A malformed-HTTP fuzz against one in-process ``hetero serve`` app (httpx2's ASGI transport: the real app,
its middleware, validation and error handlers, without a socket). Several hundred seeded bodies across the POST
endpoints: not JSON, truncated JSON, JSON that is no object, each field with wrong types, out-of-range and huge
values, bad token ids, empty and too long prompts, bad messages, lone surrogates, wrong content types and
methods. Each gets a 4xx in OpenAI's error shape naming the field at fault (or saying the body is not JSON);
never a 5xx or a hang. Afterwards the instance is healthy, a greedy completion returns the tokens it returned
before, and the engine holds no request and no KV block.

Unknown fields are not malformed: hetero ignores them as vLLM does (``protocol``), so a few are sent as a
control and must get a 200."""

from __future__ import annotations

import asyncio
import collections
import json
import random
import time
from dataclasses import dataclass

import pytest

pytest.importorskip("fastapi")
httpx2 = pytest.importorskip("httpx2")
from _serving import with_chat_template  # noqa: E402

from hetero.engine import LLM  # noqa: E402
from hetero.serve import build_app  # noqa: E402

ENGINE = dict(backend="cpu_ref", dtype="float32", block_size=8, max_num_seqs=4)
SEED = 38
MODEL = "tiny"
JSON = "JSON"  # what a reply to a body that is no JSON object must say

COMPLETION = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0.0}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0.0}
#: endpoint -> a body it answers with a 200
VALID = {
    "/v1/completions": COMPLETION,
    "/v1/chat/completions": CHAT,
    "/v1/completions/render": {"model": MODEL, "prompt": [5, 6, 7]},
    "/v1/chat/completions/render": {"model": MODEL, "messages": CHAT["messages"]},
    "/tokenize": {"prompt": "hello"},
}
GENERATE = ("/v1/completions", "/v1/chat/completions")

#: field -> (kind, whether null is allowed)
SAMPLING = {
    "model": ("str", True),
    "max_tokens": ("int", True),
    "temperature": ("float", False),
    "top_p": ("float", False),
    "top_k": ("int", False),
    "n": ("int", False),
    "seed": ("int", True),
    "stop": ("stop", True),
    "stream": ("bool", False),
    "ignore_eos": ("bool", False),
    "stop_token_ids": ("ids", False),
    "return_token_ids": ("bool", False),
    "kv_transfer_params": ("dict", True),
}
FIELDS = {
    "/v1/completions": {**SAMPLING, "prompt": ("prompt", False), "logprobs": ("int", True), "echo": ("bool", False)},
    "/v1/chat/completions": {
        **SAMPLING,
        "messages": ("messages", False),
        "max_completion_tokens": ("int", True),
        "logprobs": ("bool", False),
        "top_logprobs": ("int", True),
    },
    "/tokenize": {"prompt": ("prompt", False), "add_special_tokens": ("bool", False)},
}
FIELDS["/v1/completions/render"] = FIELDS["/v1/completions"]
FIELDS["/v1/chat/completions/render"] = FIELDS["/v1/chat/completions"]

NAN, INF = float("nan"), float("inf")
WRONG = {
    "int": ["5", 1.5, 2.0, True, [1], {"a": 1}, "", NAN, INF, -INF],
    "float": ["0.5", True, [0.5], {"x": 1}, "", NAN, INF, -INF],
    "bool": ["true", 1, 0, "yes", [True], {}, 1.0],
    "str": [5, 1.5, True, ["a"], {"a": 1}],
    "stop": [5, True, [1], [None], {"a": "b"}, [["x"]]],
    "ids": ["1", 5, [1.5], ["1"], [True], [[1]], [None], {"a": 1}],
    "dict": [[], "x", 5, True],
    "prompt": [5, 1.5, True, {"a": 1}, [1.5], [True], [[1, 2]], ["a", 1], [None], [{}]],
    "messages": [
        "hi",
        {},
        ["hi"],
        [{}],
        [None],
        [{"role": "user"}],
        [{"content": "hi"}],
        [{"role": "bot", "content": "hi"}],
        [{"role": 1, "content": "hi"}],
        [{"role": "user", "content": None}],
        [{"role": "user", "content": 5}],
        [{"role": "user", "content": ["hi"]}],
        [{"role": "user", "content": {"text": "hi"}}],
        [{"role": "user", "content": "hi"}, {"role": "nobody", "content": "hi"}],
    ],
}


@dataclass
class Case:
    category: str
    path: str
    body: bytes
    names: str  # the field param must name; or what the message must say (JSON, the path)
    content_type: str | None = "application/json"
    method: str = "POST"


def _dumps(body) -> bytes:
    return json.dumps(body).encode()


def cases(vocab: int, max_model_len: int) -> list[Case]:
    """The malformed requests, the same every run (seeded)."""
    rng = random.Random(SEED)
    out: list[Case] = []

    def add(category, path, body, names, **kw):
        out.append(Case(category, path, body if isinstance(body, bytes) else _dumps(body), names, **kw))

    for path, valid in VALID.items():
        text = _dumps({**valid, "stop": ["x"], "seed": 3}).decode()
        garbage = [b"not json", b"{", b"}", b"{'prompt': [1]}", b'{"prompt": [1],}', b"prompt=1&max_tokens=2"]
        garbage += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40))) for _ in range(4)]
        garbage += [b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", b'{"n": 1' + b"0" * 5000 + b"}"]
        for body in garbage:
            add("not JSON", path, body, JSON)
        for cut in sorted(rng.sample(range(1, len(text)), 10)):
            add("truncated JSON", path, text[:cut].encode(), JSON)
        for body in (b"", b"[]", b"[1, 2]", b'"x"', b"5", b"1.5", b"true", b"null"):
            add("not an object", path, body, JSON)
        for content_type in ("text/plain", None, "application/x-www-form-urlencoded"):
            add("content type", path, _dumps(valid), JSON, content_type=content_type)
        add("method", path, b"", path, method="GET")
        for field, (kind, nullable) in FIELDS[path].items():
            values = WRONG[kind] + ([] if nullable else [None])
            if path.endswith("render"):  # the same models as the completions': a sample is enough
                values = rng.sample(values, 3)
            for value in values:
                add("wrong type", path, {**valid, field: value}, field)
        for field, value in (("messages", []), ("messages", None), ("prompt", None)):
            if field in FIELDS[path]:
                add("wrong type", path, {**valid, field: value}, field)
        required = "messages" if "messages" in valid else "prompt"
        add("wrong type", path, {k: v for k, v in valid.items() if k != required}, required)
        for name in ("\ud800", "a\udfffb") if "model" in FIELDS[path] else ():
            add("lone surrogate", path, {**valid, "model": name}, "model")
        if "messages" in valid:
            add("lone surrogate", path, {**valid, "messages": [{"role": "user", "content": "x\ud800"}]}, "messages")
        else:
            add("lone surrogate", path, {**valid, "prompt": "x\udbff"}, "prompt")
    add("method", "/v1/nope", _dumps(COMPLETION), "/v1/nope")

    huge = [10**12, 10**30, 2**63, 2**64]
    limits = {
        "max_tokens": [0, -1, -(2**63), max_model_len + 1, *huge],
        "temperature": [-1, -1e-9, -1e308],
        "top_p": [0, 2, -0.5, 1.0000001, 1e308],
        "top_k": [-1, -(10**30)],
        "n": [0, 2, -1, 10**30],
        "seed": [-1, 2**63, 2**64, 10**30, -(2**64)],
        "stop_token_ids": [[-1], [5, -3], [-(2**63)]],
        "model": ["another-model", "", "m" * 100_000],
    }
    for path in GENERATE:
        own = {"logprobs": [-1, vocab + 1, 10**6, 10**30]} if path == GENERATE[0] else {}
        if path == GENERATE[1]:
            own = {"max_completion_tokens": [0, -5, max_model_len + 1, 10**12], "top_logprobs": [vocab + 1, 10**6]}
        for field, values in {**limits, **own}.items():
            for value in values:
                add("out of range", path, {**VALID[path], "temperature": 1.0, field: value}, field)  # seeds draw
        for raw in (b"1e999", b"-1e999"):
            add("out of range", path, _dumps(VALID[path])[:-1] + b', "temperature": ' + raw + b"}", "temperature")
        pd = {**VALID[path], "kv_transfer_params": {"do_remote_decode": True}}  # this instance has no pd role
        add("out of range", path, pd, "kv_transfer_params")
        for _ in range(6):
            field, (kind, _) = rng.choice([f for f in FIELDS[path].items() if f[0] != "model"])
            unknown = {f"x_{rng.randrange(10**6)}": rng.choice([1, "a", None, [1], {"b": 2}])}
            add("unknown + wrong type", path, {**VALID[path], **unknown, field: rng.choice(WRONG[kind])}, field)

    bad_ids = [[-1], [vocab], [vocab + 7], [2**63], [2**64], [10**30], [-(2**63)]]
    for _ in range(12):
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 30))]
        ids.insert(rng.randrange(len(ids) + 1), rng.choice([-1, vocab, vocab + rng.randrange(10**6), -(10**9)]))
        bad_ids.append(ids)
    for path in ("/v1/completions", "/v1/completions/render", "/tokenize"):
        for ids in bad_ids:
            add("bad token ids", path, {**VALID[path], "prompt": ids}, "prompt")
    for ids in bad_ids[:6]:
        add("bad token ids", "/v1/completions", {**COMPLETION, "prompt": ids, "stream": True}, "prompt")

    for stream in (False, True):
        for prompt in ([], ""):
            add("empty prompt", "/v1/completions", {**COMPLETION, "prompt": prompt, "stream": stream}, "prompt")
    for prompt in ([5] * (max_model_len + 1), [5] * 100_000, "a" * (1 << 20)):
        add("too long", "/v1/completions", {**COMPLETION, "prompt": prompt}, "prompt")
    for messages in ([{"role": "user", "content": "a" * 65536}], [{"role": "user", "content": "hi"}] * 2000):
        add("too long", "/v1/chat/completions", {**CHAT, "messages": messages}, "messages")
    return out


def controls(rng: random.Random) -> list[tuple[str, dict]]:
    """Requests that look odd and are fine: unknown fields (ignored), extreme but valid values."""
    unknown = [{"foo": 1}, {"user": "x", "logit_bias": {"5": 1}}, {f"x_{rng.randrange(10**6)}": [None, {"a": []}]}]
    out = [(path, {**VALID[path], **extra}) for path in VALID for extra in unknown]
    out += [("/v1/completions", {**COMPLETION, **extra}) for extra in ({"top_k": 10**30}, {"temperature": 1e308})]
    out.append(("/v1/completions", {**COMPLETION, "stop_token_ids": [2**70], "seed": 2**63 - 1}))
    return out


@pytest.fixture(scope="module")
def instance(checkpoints, tmp_path_factory):
    path = with_chat_template(checkpoints("qwen3"), tmp_path_factory.mktemp("fuzz") / "tiny-qwen3")
    llm = LLM(path, **ENGINE)
    return llm, build_app(llm, MODEL)


def _problem(case: Case, status: int, reply: bytes) -> str | None:
    """What is wrong with the reply to ``case`` (None: nothing)."""
    if not 400 <= status < 500:
        return f"status {status}"
    try:
        error = json.loads(reply)["error"]
    except (ValueError, KeyError, TypeError):
        return f"status {status}, not OpenAI's error body: {reply[:200]!r}"
    if set(error) != {"message", "type", "param", "code"} or error["code"] != status or not error["message"]:
        return f"a malformed error body: {error}"
    if case.names.startswith("/") or case.names == JSON:
        if case.names not in error["message"]:
            return f"the message does not say {case.names!r}: {str(error)[:300]}"
    elif (error["param"] or "").split(".")[0] != case.names:
        return f"param is not {case.names!r} (or a path in it): {str(error)[:300]}"
    return None


async def _fuzz(app, llm) -> None:
    transport = httpx2.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx2.AsyncClient(transport=transport, base_url="http://fuzz", timeout=60) as client:

        async def send(case: Case):
            headers = {"content-type": case.content_type} if case.content_type else {}
            reply = await asyncio.wait_for(
                client.request(case.method, case.path, content=case.body or None, headers=headers), 60
            )
            return reply.status_code, reply.content

        async def greedy() -> list[int]:
            body = {**COMPLETION, "max_tokens": 8, "ignore_eos": True, "return_token_ids": True}
            reply = await client.post("/v1/completions", json=body)
            assert reply.status_code == 200, reply.text
            return reply.json()["choices"][0]["token_ids"]

        before = await greedy()
        vocab, max_model_len = llm.config.hf_config.vocab_size, llm.config.max_model_len
        fuzz = cases(vocab, max_model_len)
        counts = collections.Counter(c.category for c in fuzz)
        assert len(fuzz) >= 500 and min(counts.values()) >= 4, counts
        problems = []
        for start in range(0, len(fuzz), 8):  # eight at a time: the engine sees refusals side by side
            batch = fuzz[start : start + 8]
            for case, (status, reply) in zip(batch, await asyncio.gather(*map(send, batch))):
                if (problem := _problem(case, status, reply)) is not None:
                    problems.append(f"[{case.category}] {case.method} {case.path} {case.body[:120]!r}: {problem}")
        assert not problems, f"{len(problems)} of {len(fuzz)} malformed requests:\n" + "\n".join(problems[:30])

        for path, body in controls(random.Random(SEED)):
            reply = await client.post(path, json=body)
            assert reply.status_code == 200, (path, body, reply.text[:300])

        assert (await client.get("/health")).status_code == 200
        assert await greedy() == before
        deadline = time.monotonic() + 30
        while app.state.engine.num_requests or llm.scheduler.has_unfinished():
            assert time.monotonic() < deadline, "a request was left in the engine"
            await asyncio.sleep(0.01)
        assert (await client.get("/get_load")).json() == {"load": 0}
    cache = llm.block_manager
    assert cache.num_used_blocks == 0 and cache.num_free_blocks == cache.num_blocks


def test_malformed_requests_get_a_4xx_naming_the_field_and_leave_the_instance_healthy(instance):
    llm, app = instance

    async def run():
        async with app.router.lifespan_context(app):
            await _fuzz(app, llm)

    asyncio.run(run())
