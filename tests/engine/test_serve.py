"""``hetero serve`` against the official ``openai`` client on localhost: completions and chat, streamed
and whole, equal to offline ``generate``; bad requests; a disconnect mid-stream; concurrency;
/v1/models, /health and Prometheus /metrics. Every server is stopped by its fixture and every
request is bounded in count and time."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import math
import sys
import time

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
from _serving import (  # noqa: E402
    TIMEOUT,
    Server,
    command_servers,
    concurrent_streams,
    get,
    leave_a_whole_request,
    prompts,
    wait_aborted,
    with_chat_template,
)
from _serving import client as serving_client  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from hetero.distributed import free_port  # noqa: E402
from hetero.engine import LLM, SamplingParams  # noqa: E402
from hetero.serve import build_app  # noqa: E402

ENGINE = dict(backend="cpu_ref", dtype="float32", block_size=8, max_num_seqs=16)


def engine(path) -> LLM:
    return LLM(path, **ENGINE)


@pytest.fixture(scope="module")
def path(checkpoints, tmp_path_factory):
    """The tiny Qwen3 with its char-level tokenizer and a plain chat template."""
    return with_chat_template(checkpoints("qwen3"), tmp_path_factory.mktemp("served") / "tiny-qwen3")


@pytest.fixture(scope="module")
def served(path):
    llm = engine(path)
    server = Server(build_app(llm, "tiny-qwen3"))
    yield server, llm
    server.stop()


@pytest.fixture
def client(served):
    return serving_client(served[0].url)


def offline(path, prompt_list, max_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [o.token_ids for o in engine(path).generate(prompt_list, params, progress=False)]


GREEDY = dict(temperature=0.0, extra_body={"ignore_eos": True, "return_token_ids": True})


def test_completions_whole_and_streamed_equal_offline_generate(client, path):
    ps = prompts(3)
    want = offline(path, ps, 10)
    for p, w in zip(ps, want):
        whole = client.completions.create(model="tiny-qwen3", prompt=p, max_tokens=10, **GREEDY)
        choice = whole.choices[0]
        assert choice.token_ids == w and choice.finish_reason == "length"
        assert whole.usage.completion_tokens == 10 and whole.usage.prompt_tokens == len(p)
        chunks = list(client.completions.create(model="tiny-qwen3", prompt=p, max_tokens=10, stream=True, **GREEDY))
        assert [t for c in chunks for t in c.choices[0].token_ids] == w
        assert "".join(c.choices[0].text for c in chunks) == choice.text
        assert chunks[-1].choices[0].finish_reason == "length"


def test_a_text_prompt_decodes_like_the_tokenizer(client, path, served):
    tok = served[1].tokenizer
    out = client.completions.create(model="tiny-qwen3", prompt="hello there", max_tokens=6, **GREEDY)
    choice = out.choices[0]
    assert choice.token_ids == offline(path, ["hello there"], 6)[0]
    assert choice.text == tok.decode(choice.token_ids, skip_special_tokens=True)


def test_chat_renders_the_template_and_streams(client, path, served):
    tok = served[1].tokenizer
    messages = [{"role": "user", "content": "hi!"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    want = offline(path, [ids], 7)[0]
    whole = client.chat.completions.create(model="tiny-qwen3", messages=messages, max_tokens=7, **GREEDY)
    assert whole.choices[0].token_ids == want
    assert whole.choices[0].message.content == tok.decode(want, skip_special_tokens=True)
    chunks = list(
        client.chat.completions.create(model="tiny-qwen3", messages=messages, max_tokens=7, stream=True, **GREEDY)
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content


@pytest.mark.parametrize(
    "change,param",
    [
        (dict(temperature=-1.0), "temperature"),
        (dict(model="another-model"), "model"),
        (dict(n=2), "n"),
        (dict(prompt=[3, 4, 100000]), "prompt"),
        (dict(max_tokens=0), "max_tokens"),
    ],
)
def test_bad_requests_get_a_400_and_the_server_goes_on(client, change, param):
    args = {"model": "tiny-qwen3", "prompt": [5, 6, 7], "max_tokens": 4, **change}
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(**args)
    body = err.value.body
    assert param in (body.get("param") or "") + body["message"], body
    assert client.completions.create(model="tiny-qwen3", prompt=[5, 6, 7], max_tokens=2).choices[0].finish_reason


def test_chat_without_a_template_is_a_400(checkpoints):
    llm = engine(str(checkpoints("qwen3")))  # its tokenizer has no chat template
    server = Server(build_app(llm, "plain"))
    try:
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
        with pytest.raises(openai.BadRequestError, match="chat template"):
            c.chat.completions.create(model="plain", messages=[{"role": "user", "content": "x"}])
    finally:
        server.stop()


def test_a_client_gone_mid_stream_aborts_its_request(client, served):
    llm = served[1]
    stream = client.completions.create(
        model="tiny-qwen3",
        prompt=[9, 8, 7, 6],
        max_tokens=400,
        stream=True,
        temperature=0.0,
        extra_body={"ignore_eos": True},
    )
    next(iter(stream))
    stream.close()
    wait_aborted(llm)
    assert llm.block_manager.num_used_blocks == 0


def test_a_client_gone_from_a_whole_request_aborts_it(served):
    """Not streamed: the server still sees the connection close, and aborts."""
    llm, port = served[1], served[0].port
    before = llm.stats["generated_tokens"]
    leave_a_whole_request(port, llm)
    wait_aborted(llm)
    assert llm.block_manager.num_used_blocks == 0 and llm.stats["generated_tokens"] - before < 400


def test_32_concurrent_streams_equal_offline_generate(client, path):
    ps = prompts(32, seed=1)
    assert concurrent_streams(client, "tiny-qwen3", ps, 6) == offline(path, ps, 6)


def test_models_health_and_metrics(client, served):
    server, llm = served
    assert [m.id for m in client.models.list().data] == ["tiny-qwen3"]
    assert get(server.url + "/health")[0] == 200
    client.completions.create(model="tiny-qwen3", prompt=[4, 5, 6], max_tokens=3, **GREEDY)
    text = get(server.url + "/metrics")[1]
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in (
        "hetero_num_requests_running",
        "hetero_num_requests_waiting",
        "hetero_kv_cache_usage_perc",
        "hetero_num_preemptions",
        "hetero_time_to_first_token_seconds",
        "hetero_time_per_output_token_seconds",
    ):
        assert name in families, sorted(families)
    ttft = {s.name: s.value for s in families["hetero_time_to_first_token_seconds"].samples}
    assert ttft["hetero_time_to_first_token_seconds_count"] >= 1


@contextlib.contextmanager
def command_server(launcher: list[str], args: list[str], seconds: float, stop_s: float, env: dict | None = None):
    """One ``hetero serve`` process (``command_servers``) and an openai client of it."""
    with command_servers([(launcher, args)], seconds, stop_s, env) as urls:
        yield serving_client(urls[0])


def test_the_serve_command_answers_and_stops(path):
    args = ["--model", path, "--backend", "cpu_ref", "--dtype", "float32", "--served-model-name", "tiny"]
    with command_server([sys.executable], args, TIMEOUT, 30) as c:
        out = c.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=5, **GREEDY)
        assert out.choices[0].token_ids == offline(path, [[5, 6, 7]], 5)[0]


def test_bench_serve_reports_percentiles_goodput_and_baselines(served, tmp_path, capsys):
    from hetero.cli import main

    url = served[0].url
    base = [
        "bench-serve",
        "--url",
        url,
        "--num-prompts",
        "8",
        "--request-rate",
        "50",
        "--max-concurrency",
        "4",
        "--random-input-len",
        "8",
        "--random-output-len",
        "4",
        "--ignore-eos",
        "--seed",
        "3",
    ]
    out, saved = tmp_path / "run.json", tmp_path / "base.json"
    assert main([*base, "--slo", "ttft=600000,tpot=600000", "--json", str(out), "--save", str(saved)]) == 0
    text = capsys.readouterr().out
    assert "8 requests done, 0 failed" in text and "TTFT" in text and "p99" in text and "goodput" in text
    doc = json.loads(out.read_text())
    summary = doc["summary"]
    assert summary["completed"] == 8 and summary["total_output_tokens"] == 32
    assert summary["ttft_ms"]["p50"] > 0 and summary["tpot_ms"]["p90"] > 0 and summary["itl_ms"]["mean"] > 0
    assert summary["goodput"] == pytest.approx(8 / summary["duration_s"])
    assert len(doc["requests"]) == 8 and all(r["output_tokens"] == 4 for r in doc["requests"])
    # a baseline a million times worse than the run: the comparison runs and cannot regress on a noisy machine
    doc = json.loads(saved.read_text())
    for m in doc["metrics"]:
        scale = 1e-6 if m["higher_is_better"] else 1e6
        m["value"], m["samples"] = m["value"] * scale, [v * scale for v in m["samples"]]
    saved.write_text(json.dumps(doc))
    assert main([*base, "--compare", str(saved)]) == 0
    assert "against the baseline" in capsys.readouterr().out
    assert main([*base[:2], url.replace("127.0.0.1", "localhost"), *base[3:], "--compare", str(saved)]) == 2
    assert "--compare" in capsys.readouterr().err


def test_bench_serve_arrivals():
    from hetero.bench.serve import arrival_gaps

    assert arrival_gaps(3, math.inf, 1.0, 0) == [0.0] * 3
    assert arrival_gaps(4, 10.0, math.inf, 0) == [0.1] * 4
    poisson = arrival_gaps(4000, 10.0, 1.0, 0)
    assert abs(sum(poisson) / len(poisson) - 0.1) < 0.01 and poisson != arrival_gaps(4000, 10.0, 1.0, 1)


@pytest.mark.parametrize("parallel", ["--tensor-parallel-size", "--pipeline-parallel-size"])
def test_two_ranks_under_torchrun_rank0_serves_and_the_ranks_step_together(path, parallel):
    """Two ranks over gloo (TP=2, or PP=2: two stages, micro-batches in flight): rank 0 answers, rank 1
    follows; tokens, whole and streamed, equal one process's."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
    launcher += ["--master-port", str(free_port())]
    args = ["--model", path, "--backend", "cpu_ref", "--dtype", "float32", parallel, "2", "--served-model-name", "tiny"]
    with command_server(launcher, args, 300, 60, env={"OMP_NUM_THREADS": "1"}) as c:
        ps = prompts(3, seed=5)
        want = offline(path, ps, 6)
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            got = list(
                pool.map(
                    lambda p: c.completions.create(model="tiny", prompt=p, max_tokens=6, **GREEDY).choices[0].token_ids,
                    ps,
                    timeout=TIMEOUT,
                )
            )
        assert got == want
        assert concurrent_streams(c, "tiny", ps, 6) == want
        time.sleep(2 * 0.5)  # idle: rank 0 keeps meeting rank 1, and the next request is served still
        assert c.completions.create(model="tiny", prompt=ps[0], max_tokens=6, **GREEDY).choices[0].token_ids == want[0]


def test_a_stop_string_cuts_the_text_and_logprobs_come_back(client):
    # seeded sampling: the random model's greedy picks are mostly ids the char-level tokenizer lacks
    base = dict(
        model="tiny-qwen3", prompt="abc", max_tokens=32, temperature=1.0, seed=7, extra_body={"ignore_eos": True}
    )
    full = client.completions.create(**base).choices[0].text
    assert len(full) >= 6, full
    stop = full[3:5]
    cut = client.completions.create(**base, stop=[stop]).choices[0]
    assert cut.text == full[: full.find(stop)] and cut.finish_reason == "stop"
    streamed = list(client.completions.create(**base, stop=[stop], stream=True))
    assert "".join(c.choices[0].text for c in streamed) == cut.text
    assert streamed[-1].choices[0].finish_reason == "stop"
    lp = client.completions.create(**{**base, "max_tokens": 4}, logprobs=2).choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert all(v <= 0 for v in lp.token_logprobs) and all(2 <= len(t) <= 3 for t in lp.top_logprobs)
