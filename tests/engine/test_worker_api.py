"""What a router and an operator read from an instance besides the OpenAI API (vLLM's names), the API key,
and a stream the engine fails mid-way ending with an explicit error event."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
from _serving import Server, client  # noqa: E402

from hetero.engine import LLM  # noqa: E402
from hetero.serve import build_app  # noqa: E402

ENGINE = dict(backend="cpu_ref", dtype="float32", block_size=8, max_num_seqs=4)


def _call(url: str, method: str = "GET", body: dict | None = None, key: str | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data, headers, method=method), timeout=60) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


@pytest.fixture(scope="module")
def served(checkpoints):
    llm = LLM(str(checkpoints("qwen3")), **ENGINE)
    server = Server(build_app(llm, "tiny", api_key="s3cret"))
    yield server, llm
    server.stop()


def test_the_worker_endpoints(served):
    server, llm = served
    u = server.url
    assert _call(u + "/get_load") == (200, {"load": 0})
    status, info = _call(u + "/get_server_info")
    assert status == 200 and info["model_id"] == "tiny" and info["kv_block_size"] == 8 and info["instance_id"]
    status, info = _call(u + "/server_info?config_format=json")
    assert info["vllm_config"] == {"model_config": {"model": "tiny"}, "cache_config": {"block_size": 8}}
    assert _call(u + "/kv_event_sources") == (200, {})  # no --kv-events-config: nothing to subscribe to
    ids = [5, 6, 7, 8]
    key = "s3cret"
    assert _call(u + "/v1/completions/render", "POST", {"model": "tiny", "prompt": ids}, key)[1]["token_ids"] == ids
    status, tok = _call(u + "/tokenize", "POST", {"prompt": "hello"}, key)
    assert status == 200 and tok["tokens"] == llm.encode("hello") and tok["count"] == len(tok["tokens"])
    assert _call(u + "/v1/completions/render", "POST", {"model": "tiny", "prompt": [999999]}, key)[0] == 400


def test_a_stream_with_include_usage_ends_with_the_usage_and_its_cached_tokens(served):
    server, _ = served
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="s3cret", max_retries=0)
    ids = list(range(5, 25))
    for cached in (0, 16):  # the second time, its two full blocks of 8 come from the prefix cache
        chunks = list(
            c.completions.create(
                model="tiny", prompt=ids, max_tokens=3, stream=True, stream_options={"include_usage": True}
            )
        )
        assert all(ch.usage is None for ch in chunks[:-1]) and chunks[-1].choices == []
        usage = chunks[-1].usage
        assert (usage.prompt_tokens, usage.completion_tokens) == (20, 3)
        assert usage.prompt_tokens_details.cached_tokens == cached


def test_the_api_key_guards_v1_and_leaves_health_and_metrics_open(served):
    server, _ = served
    u = server.url
    for key, want in ((None, 401), ("wrong", 401), ("s3cret", 200)):
        status, body = _call(u + "/v1/models", key=key)
        assert status == want, (key, body)
        if want == 401:
            assert body["error"]["type"] == "AuthenticationError" and "API key" in body["error"]["message"]
    assert _call(u + "/flush_cache", "POST")[0] == 401 and _call(u + "/flush_cache", "POST", key="s3cret")[0] == 200
    assert urllib.request.urlopen(u + "/health").status == 200 and urllib.request.urlopen(u + "/metrics").status == 200
    c = openai.OpenAI(base_url=u + "/v1", api_key="s3cret", max_retries=0)
    assert c.completions.create(model="tiny", prompt=[5, 6], max_tokens=2, temperature=0.0).choices[0]
    with pytest.raises(openai.AuthenticationError):
        client(u).completions.create(model="tiny", prompt=[5, 6], max_tokens=2)


def test_a_stream_the_engine_fails_ends_with_an_error_event(served, monkeypatch):
    server, llm = served

    def broken():
        raise RuntimeError("the device fell off the bus")

    calls = {"n": 0}
    step = llm.step

    def flaky():
        calls["n"] += 1
        return step() if calls["n"] < 3 else broken()

    monkeypatch.setattr(llm, "step", flaky)
    body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 8, "stream": True, "temperature": 0.0}
    req = urllib.request.Request(
        server.url + "/v1/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json", "Authorization": "Bearer s3cret"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        events = [line[6:] for line in r.read().decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and "the device fell off the bus" in json.loads(events[-2])["error"]["message"]


def test_sigterm_drains_new_requests_get_503_and_the_running_one_finishes(checkpoints):
    """`hetero serve` under SIGTERM: health and new requests answer 503 (a router retries them elsewhere), the
    stream already running ends whole, then the process exits."""
    import signal
    import subprocess
    import sys
    import threading
    import time

    from _serving import healthy

    from hetero.distributed import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "hetero.cli", "serve", "--model", str(checkpoints("qwen3")), "--backend", "cpu_ref"]
    cmd += ["--dtype", "float32", "--port", str(port), "--served-model-name", "tiny", "--drain-timeout", "120"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url, streamed = f"http://127.0.0.1:{port}", []
    try:
        deadline = time.monotonic() + 120
        while not healthy(url):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
            time.sleep(0.2)
        c = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)

        def long_stream():
            extra = {"ignore_eos": True, "return_token_ids": True}
            chunks = c.completions.create(model="tiny", prompt=[5, 6], max_tokens=400, stream=True, extra_body=extra)
            streamed.extend(t for ch in chunks for t in ch.choices[0].token_ids)

        runner = threading.Thread(target=long_stream)
        runner.start()
        while _call(url + "/get_load")[1]["load"] == 0:
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        with pytest.raises(urllib.error.HTTPError, match="503"):
            urllib.request.urlopen(url + "/health", timeout=30)
        status, body = _call(url + "/v1/completions", "POST", {"model": "tiny", "prompt": [5], "max_tokens": 2})
        assert status == 503 and body["error"]["type"] == "ServiceUnavailableError", (status, body)
        runner.join(120)
        assert len(streamed) == 400, "the running stream was cut"
        proc.wait(60)
    finally:
        proc.kill()
