"""vllm-router's policies over three hetero instances under one multi-turn, shared-prefix load.

    .venv/bin/python benchmarks/router.py [--model qwen3 | --model qwen3-0.6b | --model DIR] [--dtype bfloat16]
        [--policies round_robin,cache_aware,kv_aware] [--users 12] [--rounds 4] [--system-len 256]
        [--history-len 64] [--question-len 32] [--output-len 16] [--request-rate 4] [--repeats 2]
        [--format text | tokens] [--threads 1] [--markdown FILE]

Three ``hetero serve`` instances (torch backend, ``OMP_NUM_THREADS`` = ``--threads`` each) publish KV events
(``--kv-events-config``), so kv_aware can follow them. For each policy in turn, ``--repeats`` times interleaved
(so drift hits each alike): every instance's prefix cache is flushed (``POST /flush_cache``), vllm-router starts in
front of the three, and ``hetero bench-serve``'s multi-turn dataset (``hetero.bench.multiturn``: users sharing a
system prompt, each round's prompt the whole conversation so far) runs through it in this process. Per policy, the
medians over the repeats of: the prefix-cache hit rate (cached prompt tokens over prompt tokens, from each
response's usage), TTFT p50 / p90, output tok/s and requests/s; and how the requests fell on the instances (their
``hetero_request_success`` counters); for kv_aware, the router's own count of the prefix lookups that found blocks
(``vllm_router_kv_placement_lookups_total{result="hit"}`` of its Prometheus metrics, scraped after each run).
``--model`` is a checkpoint directory or one of ``_workloads.MODELS``'s random checkpoints (default the tiny qwen3;
``qwen3-0.6b`` is Qwen3-0.6B's shape), which get hetero.tools.tiny's character-level tokenizer.

``--format text`` (default): the prompts are text (the lengths, given in tokens, become words at the checkpoint
tokenizer's mean tokens per word of ``WORDS``), which kv_aware scores by rendering them on the instance.
``--format tokens``: token ids with ``return_token_ids``, which kv_aware gives no prefix credit (a field its request
type does not know), so its row is load routing only. The router's ``--kv-event-block-size`` is the instances'
block size: a mismatch gives no credit either.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _servers import ROUTER, stopping, wait_up  # noqa: E402

from hetero.distributed import free_port  # noqa: E402
from hetero.tools.tiny import char_tokenizer  # noqa: E402

NAME, BLOCK = "bench", 16


@contextlib.contextmanager
def _instances(args: argparse.Namespace, model: Path, max_len: int):
    """Three hetero serve processes: [(url, KV events endpoint)]."""
    made = []
    with stopping() as procs:
        for _ in range(3):
            port, events = free_port(), f"tcp://127.0.0.1:{free_port()}"
            kv = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": events})
            cmd = [sys.executable, "-m", "hetero.cli", "serve", "--model", str(model), "--backend", "torch"]
            cmd += ["--dtype", args.dtype, "--block-size", str(BLOCK), "--max-model-len", str(max_len)]
            cmd += ["--served-model-name", NAME, "--port", str(port), "--kv-events-config", kv]
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
            made.append((f"http://127.0.0.1:{port}", events))
        for proc, (url, _) in zip(procs, made):
            wait_up(proc, url, 900)
        yield made


@contextlib.contextmanager
def _router(made: list[tuple[str, str]], policy: str):
    """(its URL, its Prometheus metrics' URL)."""
    port, prom = free_port(), free_port()
    cmd = [ROUTER, "--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(prom)]
    cmd += ["--health-check-interval-secs", "1", "--policy", policy, "--worker-urls", *(u for u, _ in made)]
    if policy == "kv_aware":
        cmd += ["--kv-event-model", NAME, "--kv-event-block-size", str(BLOCK)]
        cmd += [f"--kv-event-source={url}={events}" for url, events in made]
    with stopping(30) as procs:
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        url = f"http://127.0.0.1:{port}"
        wait_up(procs[0], url, 60)
        time.sleep(1.0)  # kv_aware's subscriptions reach the publishers (ZMQ's slow joiner)
        yield url, f"http://127.0.0.1:{prom}/metrics"


def _post(url: str) -> None:
    urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=60).read()


def _samples(url: str, name: str) -> list:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as r:
        return [s for f in text_string_to_metric_families(r.read().decode()) for s in f.samples if s.name == name]


def _finished(url: str) -> float:
    return sum(s.value for s in _samples(url + "/metrics", "hetero_request_success_total"))


async def _load(url: str, convs, args: argparse.Namespace):
    import openai

    from hetero.bench.multiturn import run_multi_turn
    from hetero.bench.serve import arrival_gaps, summarize

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
    try:
        gaps = arrival_gaps(len(convs), args.request_rate, args.burstiness, args.seed)
        results, seconds, _ = await run_multi_turn(client, NAME, convs, args.output_len, gaps, None, True)
    finally:
        await client.close()
    return summarize(results, seconds, {})


def _run(made, policy: str, convs, args: argparse.Namespace) -> dict:
    for url, _ in made:
        _post(url + "/flush_cache")
    before = [_finished(url) for url, _ in made]
    with _router(made, policy) as (url, metrics):
        summary = asyncio.run(_load(url, convs, args))
        lookups = _samples(metrics, "vllm_router_kv_placement_lookups_total")
    summary["kv_lookups"] = {s.labels.get("result", ""): s.value for s in lookups}
    summary["per_instance"] = [_finished(u) - b for (u, _), b in zip(made, before)]
    if summary["failed"]:
        raise RuntimeError(f"{policy}: {summary['failed']} requests failed: {summary['errors']}")
    return summary


def _conversations(args: argparse.Namespace, model: Path, vocab: int) -> tuple[list, int]:
    """(the conversations, the tokens of the longest one's prompts less its answers)."""
    from hetero.bench.multiturn import WORDS, conversations

    lens = [args.system_len, args.history_len, args.question_len]
    if args.format == "tokens":
        convs = conversations(args.users, args.rounds, *lens, args.seed, "tokens", vocab)
        return convs, args.system_len + args.history_len + args.rounds * args.question_len
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model)
    except (OSError, ValueError) as e:
        sys.exit(f"{model} has no tokenizer ({e}): run with --format tokens")
    per_word = len(tokenizer.encode("".join(" " + w for w in WORDS))) / len(WORDS)
    args.words = [int(n // per_word) for n in lens[:2]] + [max(1, int(lens[2] // per_word))]
    convs = conversations(args.users, args.rounds, *args.words, args.seed)
    return convs, max(len(tokenizer.encode(c.system + c.history + "".join(c.questions))) for c in convs)


def measure(args: argparse.Namespace, model: Path) -> dict[str, list[dict]]:
    config = json.loads((model / "config.json").read_text())
    convs, prompts = _conversations(args, model, config["vocab_size"])
    max_len = prompts + args.rounds * args.output_len
    if max_len > config.get("max_position_embeddings", max_len):
        sys.exit(f"a conversation of {max_len} tokens exceeds the model's {config['max_position_embeddings']}")
    runs: dict[str, list[dict]] = {p: [] for p in args.policies}
    with _instances(args, model, max_len) as made:
        for url, _ in made:  # warm-up: each instance's first forward outside the measured runs
            body = json.dumps({"model": NAME, "prompt": [1, 2, 3], "max_tokens": 2}).encode()
            req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=600).read()
        for _ in range(args.repeats):
            for policy in args.policies:
                runs[policy].append(_run(made, policy, convs, args))
                print(f"{policy}: {_row(policy, runs[policy][-1:])}", file=sys.stderr, flush=True)
    return runs


def _row(policy: str, runs: list[dict]) -> str:
    def med(f) -> float:
        return statistics.median(f(s) for s in runs)

    hit = med(lambda s: s["prefix_hit_rate"] if s["prefix_hit_rate"] is not None else float("nan"))
    spread = " / ".join(f"{n:.0f}" for n in runs[-1]["per_instance"])
    lookups = " / ".join(f"{s['kv_lookups'].get('hit', 0):.0f} of {sum(s['kv_lookups'].values()):.0f}" for s in runs)
    return (
        f"| {policy} | {hit:.1%} | {med(lambda s: s['ttft_ms']['p50']):.0f} / {med(lambda s: s['ttft_ms']['p90']):.0f} "
        f"| {med(lambda s: s['output_throughput']):.1f} | {med(lambda s: s['request_throughput']):.2f} | {spread} "
        f"| {lookups if policy == 'kv_aware' else '-'} |"
    )


def markdown(runs: dict[str, list[dict]], command: str, args: argparse.Namespace) -> str:
    lines = [f"`{command}`", ""]
    if args.format == "text":
        lines += [f"text prompts: system / history / question {' / '.join(map(str, args.words))} words", ""]
    lines.append(
        "| policy | prefix hit rate | TTFT p50 / p90 ms | output tok/s | req/s | requests per instance (last run) "
        "| kv lookups hit of all (each run) |"
    )
    lines.append("|---|---:|---:|---:|---:|---|---|")
    lines += [_row(policy, summaries) for policy, summaries in runs.items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3", help="a checkpoint directory, or a name in _workloads.MODELS")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--policies", default="round_robin,cache_aware,kv_aware")
    p.add_argument("--users", type=int, default=12)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--system-len", type=int, default=256)
    p.add_argument("--history-len", type=int, default=64)
    p.add_argument("--question-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--request-rate", type=float, default=4.0, help="users arriving per second")
    p.add_argument("--burstiness", type=float, default=float("inf"), help="gamma shape of the arrival gaps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--format", choices=("text", "tokens"), default="text", help="prompts as text, or as token ids")
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each instance")
    p.add_argument("--markdown", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    args.policies = args.policies.split(",")
    if not Path(ROUTER).exists():
        sys.exit("vllm-router is not installed (pip install 'hetero[serve]')")
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(args.model)
        if not model.is_dir():
            import _workloads

            model = _workloads.write(Path(tmp), [args.model])[args.model]
            if args.format == "text":
                vocab = json.loads((model / "config.json").read_text())["vocab_size"]
                char_tokenizer(vocab).save_pretrained(model)
        runs = measure(args, model)
    text = markdown(runs, "python benchmarks/router.py " + " ".join(sys.argv[1:]), args)
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
