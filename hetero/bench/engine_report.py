"""``hetero bench-engine``: the command, its JSON and the baseline decision (its tables: ``_engine_tables``).

The baseline key is ``hetero.bench.baseline.environment`` (backend, device, versions)
plus the model (architecture and config.json hash), the workload and the engine
settings that shape it (dtype, block size, max sequences): a baseline of any other
is refused (exit 2) rather than compared. A regression is measured once more and
judged on each metric's better value (``hetero.bench.baseline.confirm``), so one
noisy run does not fail CI.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any, Mapping, Sequence

import torch
from rich.console import Console

from hetero.bench._engine_tables import print_comparison, print_summary
from hetero.bench.baseline import (
    BaselineError,
    Comparison,
    Metric,
    check_environment,
    compare,
    confirm,
    environment,
    load_baseline,
    save_baseline,
)
from hetero.bench.devices import device_label
from hetero.bench.engine import Workload, model_identity, parse_range, run_workload, summarize
from hetero.errors import UsageError

__all__ = ["bench_engine", "engine_metrics", "bench_environment", "key_error"]

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
_KEY = ("model", "workload", "engine")


def engine_metrics(summary: Mapping[str, Any]) -> list[Metric]:
    """The compared metrics of a ``summarize`` result: output tok/s, TTFT and TPOT p50/p90 (ms)."""
    metrics = [
        Metric(
            "output_throughput",
            summary["output_throughput"],
            "tok/s",
            higher_is_better=True,
            samples=(summary["output_throughput"],),
        )
    ]
    for name in ("ttft", "tpot"):
        for q in ("p50", "p90"):
            value = summary[f"{name}_s"][q]
            if value is not None:
                metrics.append(Metric(f"{name}_{q}", value * 1e3, "ms", samples=(value * 1e3,)))
    return metrics


def bench_environment(
    registry: Any, backend: str | None, model: str, workload: Workload, engine: Mapping[str, Any]
) -> dict[str, Any]:
    """The baseline key of a run: ``environment`` of the backend and device (labelled as ``hetero bench``
    labels it: a CPU with its torch thread count), plus model, workload and engine settings."""
    name = (backend or registry.select()).split(":")[0]
    entry = registry.entry(name)
    plugin = registry.plugins.get(entry.plugin)
    packages = {plugin.dist: entry.version} if plugin is not None and plugin.dist else {}
    device_type = entry.cls.device_type if entry.cls is not None else "cpu"
    device = device_label(torch.device(device_type), registry.availability(name).device_name)
    env = environment(name, device, packages)
    env.update(model=model_identity(model), workload=workload.as_dict(), engine=dict(engine))
    return env


def key_error(saved: Mapping[str, Any], current: Mapping[str, Any]) -> str | None:
    """Why a baseline's model, workload or engine settings make it incomparable with this run, or None."""
    for part in _KEY:
        old, new = saved.get(part), current.get(part)
        if part == "model" and old is not None:
            old, new = ({k: m.get(k) for k in ("architecture", "config_sha256")} for m in (old, new))
        if old != new:
            return f"the baseline's {part} is {old}, this run's is {new}: compare runs of the same {part}"
    return None


def _judge(
    llm: Any,
    args: argparse.Namespace,
    workload: Workload,
    saved: Mapping[str, Metric],
    runs: list[dict[str, Any]],
    console: Console,
) -> list[Comparison]:
    """Compare the first run; on a regression measure once more and keep each metric's better value."""
    metrics = engine_metrics(runs[0])
    comparisons = compare(saved, metrics, args.threshold)
    if not any(c.regressed for c in comparisons):
        return comparisons
    console.print("regressed: measuring the workload once more (other prompt tokens, same lengths)", style="yellow")
    run = run_workload(llm, workload, warmup=0, variant=len(runs))
    runs.append(summarize(run.outputs, run.stats, run.elapsed))
    again = {m.name: m.value for m in engine_metrics(runs[-1])}
    better = {m.name: m.higher_is_better for m in metrics}
    return [
        confirm(c, [again[c.name]], args.threshold, better[c.name]) if c.name in again and c.name in saved else c
        for c in comparisons
    ]


def _final_metrics(metrics: Sequence[Metric], runs: Sequence[Mapping[str, Any]]) -> list[Metric]:
    """The metrics to save: each one's better value over the runs, with every run's value as samples."""
    values = [{m.name: m.value for m in engine_metrics(run)} for run in runs]
    out = []
    for m in metrics:
        samples = tuple(v[m.name] for v in values if m.name in v)
        best = max(samples) if m.higher_is_better else min(samples)
        out.append(Metric(m.name, best, m.unit, m.higher_is_better, samples))
    return out


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else value


def _document(
    args: argparse.Namespace,
    env: dict,
    workload: Workload,
    llm: Any,
    runs: list[dict[str, Any]],
    metrics: Sequence[Metric],
    comparisons: Sequence[Comparison] | None,
) -> dict[str, Any]:
    prompt_lens, output_lens = workload.lengths()
    cfg = llm.config
    doc = {
        "command": _command(args, cfg.dtype),
        "workload": dict(workload.as_dict(), prompt_lens=prompt_lens, output_lens=output_lens),
        "config": {
            "model": str(cfg.model),
            "backend": env["backend"],
            "dtype": cfg.dtype,
            "block_size": cfg.block_size,
            "max_num_seqs": cfg.max_num_seqs,
            "max_num_batched_tokens": cfg.max_num_batched_tokens,
            "max_model_len": cfg.max_model_len,
            "num_kv_blocks": llm.stats["num_kv_blocks"],
            "warmup_requests": args.warmup,
        },
        "environment": env,
        "metrics": runs[0],
        "runs": runs,
        "baseline_metrics": [dict(m.__dict__, samples=list(m.samples)) for m in metrics],
    }
    if comparisons is not None:
        doc["threshold"] = args.threshold
        doc["comparison"] = [{k: _finite(v) for k, v in c.__dict__.items()} for c in comparisons]
        doc["regressed"] = [c.name for c in comparisons if c.regressed]
    return doc


def _command(args: argparse.Namespace, dtype: str) -> str:
    """The command line that reproduces the measurement (without the output and baseline options)."""
    return (
        f"hetero bench-engine --model {args.model} --backend {args.backend or '(auto)'} --dtype {dtype} "
        f"--num-requests {args.num_requests} --input-len {args.input_len} --output-len {args.output_len} "
        f"--seed {args.seed} --max-num-seqs {args.max_num_seqs} --block-size {args.block_size} "
        f"--warmup {args.warmup}"
        + (f" --threads {args.threads}" if getattr(args, "threads", None) else "")
        + (" --compile" if getattr(args, "compile", False) else "")
        + (f" --speculative-config '{args.speculative_config}'" if getattr(args, "speculative_config", None) else "")
    )


def _setup(args: argparse.Namespace, registry: Any) -> tuple[Workload, Any, dict[str, Any]]:
    """The workload, the resolved engine config and the baseline key; UsageError for unusable arguments."""
    from hetero.engine.config import EngineConfig

    for option, value in (("--threshold", args.threshold), ("--warmup", args.warmup)):
        if value < 0:
            raise UsageError(f"argument {option}: expected a number >= 0, got {value}")
    workload = Workload(
        args.num_requests, _range("--input-len", args.input_len), _range("--output-len", args.output_len), args.seed
    )
    cfg = EngineConfig(
        model=args.model,
        backend=args.backend,
        dtype=args.dtype or "auto",
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=args.pipeline_parallel_size,
        pp_layer_partition=args.pp_layer_partition,
        compile=args.compile,
        speculative_config=args.speculative_config,
    ).resolve()
    if workload.max_len > cfg.max_model_len:
        raise UsageError(
            f"--input-len and --output-len can draw sequences of {workload.max_len} tokens, longer than "
            f"the model's {cfg.max_model_len} (max_position_embeddings)"
        )
    engine = {"dtype": cfg.dtype, "block_size": cfg.block_size, "max_num_seqs": cfg.max_num_seqs}
    for name in ("tensor_parallel_size", "pipeline_parallel_size"):  # only when used, as compile
        if getattr(cfg, name) > 1:
            engine[name] = getattr(cfg, name)
    if cfg.compile:  # only then: baselines saved before the option stay comparable
        engine["compile"] = True
    if cfg.speculative_config is not None:
        engine["speculative_config"] = cfg.speculative_config.to_dict()
    return workload, cfg, bench_environment(registry, args.backend, args.model, workload, engine)


def _range(option: str, text: str) -> tuple[int, int]:
    try:
        return parse_range(text)
    except UsageError as e:
        raise UsageError(f"argument {option}: {e}") from e


def _baseline(path: str, env: Mapping[str, Any]) -> dict[str, Metric]:
    """The metrics of a baseline measured under the same key; BaselineError naming what differs."""
    try:
        saved_env, saved = load_baseline(path, "engine")
    except BaselineError as e:
        raise BaselineError(f"argument --compare: {e}") from e
    error, warnings = check_environment(saved_env, dict(env))
    error = error or key_error(saved_env, env)
    if error:
        raise BaselineError(f"argument --compare: cannot compare with {path}: {error}")
    for warning in warnings:
        Console(stderr=True).print(f"[yellow]warning:[/] {warning}", highlight=False)
    return saved


def bench_engine(args: argparse.Namespace, registry: Any, console: Console) -> int:
    """``hetero bench-engine``: 0 measured (and no regression), 1 a metric regressed, 2 unusable input."""
    from hetero.engine import LLM

    workload, cfg, env = _setup(args, registry)
    saved = _baseline(args.compare, env) if args.compare else None
    llm = LLM(
        args.model,
        backend=args.backend,
        dtype=cfg.dtype,
        block_size=cfg.block_size,
        max_num_seqs=cfg.max_num_seqs,
        tensor_parallel_size=cfg.tensor_parallel_size,
        pipeline_parallel_size=cfg.pipeline_parallel_size,
        pp_layer_partition=cfg.pp_layer_partition,
        compile=cfg.compile,
        speculative_config=cfg.speculative_config,
    )
    if llm.world.size > 1 and args.compare:
        raise UsageError("argument --compare: comparing with a baseline runs in one process only (no torchrun)")
    run = run_workload(llm, workload, args.warmup)
    if llm.rank != 0:
        return EXIT_OK
    runs = [summarize(run.outputs, run.stats, run.elapsed)]
    model = env["model"]
    print_summary(
        console,
        runs[0],
        f"bench-engine: {model['name']} ({model['architecture']}, {cfg.dtype}) on "
        f"{env['backend']}, {env['device']}; {workload.num_requests} requests, input "
        f"{args.input_len}, output {args.output_len}, seed {args.seed}",
    )
    comparisons = _judge(llm, args, workload, saved, runs, console) if saved is not None else None
    metrics = _final_metrics(engine_metrics(runs[0]), runs)
    if comparisons is not None:
        print_comparison(console, comparisons, {m.name: m.unit for m in metrics}, args.threshold)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(_document(args, env, workload, llm, runs, metrics, comparisons), f, indent=1)
    if args.save:
        save_baseline(args.save, "engine", env, metrics, _command(args, cfg.dtype))
    regressed = [c.name for c in comparisons or () if c.regressed]
    if regressed:
        Console(stderr=True).print(
            f"[red]regressed[/] (more than {args.threshold:.0%} worse than {args.compare}): {', '.join(regressed)}",
            highlight=False,
        )
        return EXIT_FAIL
    return EXIT_OK
