"""``hetero bench-serve``: the command, its table, JSON and baselines (kind "serve")."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from hetero.bench.baseline import Metric, check_environment, compare, environment, load_baseline, save_baseline
from hetero.bench.multiturn import add_multi_turn_args
from hetero.errors import UsageError

__all__ = ["add_bench_parser"]

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def add_bench_parser(sub: Any) -> None:
    p = sub.add_parser(
        "bench-serve",
        help="load-test an OpenAI-compatible server: throughput, TTFT/TPOT/ITL, goodput",
        description="Send streamed completions to a running server (hetero serve, vLLM, ...) at a "
        "request rate under a concurrency cap; flags as vllm bench serve's.",
    )
    p.add_argument("--url", "--base-url", dest="url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="model id (default: the server's first in /v1/models)")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument(
        "--request-rate", type=float, default=math.inf, help="requests per second (default inf: all at once)"
    )
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps: 1 Poisson, inf a fixed rate")
    p.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--dataset-name",
        choices=("random", "multi-turn"),
        default="random",
        help="random prompts, or conversations keeping their history over a shared system prompt",
    )
    p.add_argument("--dataset-path", default=None, help='JSONL, one {"prompt": text or ids, "output_len": n} a line')
    p.add_argument("--random-input-len", type=int, default=64)
    p.add_argument("--random-output-len", type=int, default=32)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="random token ids below this (default: the server's model card, else 1000)",
    )
    add_multi_turn_args(p)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--slo", default=None, metavar="ttft=MS,tpot=MS", help="goodput bounds in ms (ttft, tpot, e2el)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the summary and every request's timings")
    p.add_argument("--save", default=None, metavar="FILE", help="write a baseline (kind serve)")
    p.add_argument("--compare", default=None, metavar="FILE", help="compare with a baseline; exit 1 on a regression")
    p.add_argument("--threshold", type=float, default=0.2, help="regression threshold (default 0.2 = 20%% worse)")
    p.set_defaults(func=_cmd_bench_serve, needs_registry=False)


def _slo(text: str | None) -> dict[str, float]:
    if not text:
        return {}
    out = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        try:
            bound = float(value)
        except ValueError:
            bound = math.nan
        if key.strip() not in ("ttft", "tpot", "e2el") or not bound > 0:
            raise UsageError(f"argument --slo: expected ttft=MS,tpot=MS,e2el=MS with positive numbers, got {text!r}")
        out[key.strip()] = bound
    return out


def _metrics(summary: dict) -> list[Metric]:
    metrics = [
        Metric("output_throughput", summary["output_throughput"], "tok/s", higher_is_better=True),
        Metric("request_throughput", summary["request_throughput"], "req/s", higher_is_better=True),
    ]
    if summary["prefix_hit_rate"] is not None:
        metrics.append(Metric("prefix_hit_rate", summary["prefix_hit_rate"], "fraction", higher_is_better=True))
    for name in ("ttft", "tpot", "itl"):
        for q in ("p50", "p90", "p99"):
            value = summary[f"{name}_ms"][q]
            if value is not None:
                metrics.append(Metric(f"{name}_{q}", value, "ms"))
    return metrics


def _print(console: Console, summary: dict) -> None:
    console.print(
        f"{summary['completed']} requests done, {summary['failed']} failed, in "
        f"{summary['duration_s']:.2f} s: {summary['request_throughput']:.2f} req/s, "
        f"{summary['output_throughput']:.1f} output tok/s"
        + (
            f", goodput {summary['goodput']:.2f} req/s under {summary['slo_ms']}"
            if summary["goodput"] is not None
            else ""
        ),
        highlight=False,
    )
    if summary["prefix_hit_rate"] is not None:
        console.print(
            f"prefix cache hit rate {summary['prefix_hit_rate']:.1%} ({summary['total_cached_tokens']} of "
            f"{summary['total_prompt_tokens']} prompt tokens cached)",
            highlight=False,
        )
    table = Table(title="latency (ms)")
    for col in ("metric", "mean", "p50", "p90", "p99"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for name in ("ttft", "tpot", "itl", "e2el"):
        row = summary[f"{name}_ms"]
        table.add_row(
            name.upper(), *("-" if row[k] is None else f"{row[k]:.2f}" for k in ("mean", "p50", "p90", "p99"))
        )
    console.print(table)
    for error in summary["errors"]:
        console.print(f"[red]error:[/] {error}", highlight=False)


def _cmd_bench_serve(args: argparse.Namespace, registry: Any, console: Console) -> int:
    from hetero.bench.serve import arrival_gaps, file_requests, random_requests, results_json, summarize

    slo = _slo(args.slo)
    if args.num_prompts < 1 or not args.request_rate > 0 or not args.burstiness > 0:
        raise UsageError(
            "arguments --num-prompts, --request-rate, --burstiness: expected positive values, got "
            f"{args.num_prompts}, {args.request_rate}, {args.burstiness}"
        )
    if args.dataset_name == "multi-turn" and args.dataset_path:
        raise UsageError("argument --dataset-path: not with --dataset-name multi-turn (its prompts are generated)")
    model, card = asyncio.run(_model(args.url, args.model))
    vocab = args.vocab_size or card.get("vocab_size") or 1000
    if args.dataset_name == "multi-turn":
        from hetero.bench.multiturn import from_args

        specs = from_args(args, vocab)
    elif args.dataset_path:
        specs = file_requests(args.dataset_path, args.num_prompts, args.random_output_len)
    else:
        specs = random_requests(
            args.num_prompts, args.random_input_len, args.random_output_len, args.random_range_ratio, vocab, args.seed
        )
    gaps = arrival_gaps(len(specs), args.request_rate, args.burstiness, args.seed)
    results, seconds = asyncio.run(_load(args.url, model, specs, gaps, args.max_concurrency, args.ignore_eos, args))
    summary = summarize(results, seconds, slo)
    _print(console, summary)
    command = " ".join(["hetero", *sys.argv[1:]]) if sys.argv[1:2] == ["bench-serve"] else "hetero bench-serve"
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"command": command, "model": model, "summary": summary, "requests": results_json(results)}, f, indent=2
            )
    env = environment(f"server:{model}", args.url)
    if args.save:
        save_baseline(args.save, "serve", env, _metrics(summary), command)
    if args.compare:
        return _compare(console, args, env, summary)
    return EXIT_OK if summary["failed"] == 0 else EXIT_FAIL


def _compare(console: Console, args: argparse.Namespace, env: dict, summary: dict) -> int:
    from hetero.bench._engine_tables import print_comparison

    saved_env, saved = load_baseline(args.compare, "serve")
    error, warnings = check_environment(saved_env, env)
    if error:
        raise UsageError(f"argument --compare: {error}")
    for w in warnings:
        console.print(f"[yellow]warning:[/] {w}", highlight=False)
    metrics = _metrics(summary)
    comparisons = compare(saved, metrics, args.threshold)
    print_comparison(console, comparisons, {m.name: m.unit for m in metrics}, args.threshold)
    return EXIT_FAIL if any(c.regressed for c in comparisons) else EXIT_OK


async def _model(url: str, model: str | None) -> tuple[str, dict]:
    import openai

    client = openai.AsyncOpenAI(base_url=url.rstrip("/") + "/v1", api_key="unused", max_retries=0, timeout=60)
    try:
        cards = (await client.models.list()).data
    except openai.APIError as e:
        raise UsageError(f"argument --url: no OpenAI-compatible server answered at {url}: {e}") from None
    finally:
        await client.close()
    found = [c for c in cards if model is None or c.id == model]
    if not found:
        raise UsageError(f"argument --model: expected one of {[c.id for c in cards]}, got {model!r}")
    return found[0].id, found[0].model_dump()


async def _load(url: str, model: str, specs, gaps, max_concurrency, ignore_eos, args):
    import openai

    from hetero.bench.multiturn import run_multi_turn
    from hetero.bench.serve import run_load

    client = openai.AsyncOpenAI(base_url=url.rstrip("/") + "/v1", api_key="unused", max_retries=0, timeout=600)
    try:
        if args.dataset_name == "multi-turn":
            results, seconds, _ = await run_multi_turn(
                client, model, specs, args.random_output_len, gaps, max_concurrency, ignore_eos
            )
            return results, seconds
        return await run_load(client, model, specs, gaps, max_concurrency, ignore_eos)
    finally:
        await client.close()
