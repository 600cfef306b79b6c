"""``hetero profile``: run a seeded workload through the engine and print where the time goes, per op."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from rich.console import Console

from hetero.errors import UsageError

__all__ = ["add_parser", "WORKLOADS"]

EXIT_OK = 0
#: --workload presets: (requests, prompt lengths, output lengths); bench-engine's is its default workload
WORKLOADS = {"small": (4, "8:32", "4:12"), "bench-engine": (64, "32:256", "32:128")}


def _at_least(least: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < least:
            raise argparse.ArgumentTypeError(f"expected an integer >= {least}, got {text!r}")
        return value

    return parse


def add_parser(sub: Any) -> None:
    """Register the ``profile`` subcommand."""
    p = sub.add_parser(
        "profile",
        help="per-op time, GB/s, TFLOP/s and roofline of an engine run",
        description="Run a seeded workload through the engine (greedy, EOS ignored; after an unprofiled "
        "warm-up) with every op call timed: per op and per layer type, split by phase "
        "(prefill / mixed / decode), calls, total and mean time, % of step time, achieved GB/s and "
        "TFLOP/s (hetero bench's byte/flop model) and the roofline fraction; then the "
        "engine's own host time per step. --trace writes a Chrome/Perfetto trace.",
    )
    p.add_argument("--model", required=True, metavar="DIR", help="checkpoint directory")
    p.add_argument("--backend", default=None, help="backend name (default: HETERO_BACKEND, else the best available)")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: the checkpoint's)")
    p.add_argument("--block-size", type=_at_least(1), default=16, help="KV cache block size in tokens (default 16)")
    p.add_argument("--max-num-seqs", type=_at_least(1), default=64)
    p.add_argument(
        "--workload",
        choices=sorted(WORKLOADS),
        default="small",
        help="small: 4 requests, prompts 8:32, outputs 4:12 (default); bench-engine: that command's "
        "default workload (64 requests, 32:256, 32:128). The options below override either.",
    )
    p.add_argument("--num-requests", type=_at_least(1), metavar="N")
    p.add_argument("--input-len", metavar="MIN:MAX", help="prompt lengths, inclusive")
    p.add_argument("--output-len", metavar="MIN:MAX", help="output lengths, inclusive (2 or more for decode steps)")
    p.add_argument("--seed", type=int, default=0, help="seed of the lengths and prompt tokens (default 0)")
    p.add_argument(
        "--warmup", type=_at_least(0), default=1, metavar="N", help="unprofiled warm-up requests (default 1)"
    )
    p.add_argument(
        "--threads", type=_at_least(1), metavar="N", help="torch CPU threads for the run (default: torch's own)"
    )
    p.add_argument(
        "--ceilings",
        metavar="FILE.json",
        help="device ceilings for the roofline, as for `hetero bench` "
        "(default: HETERO_BENCH_CEILINGS, else the built-in table)",
    )
    p.add_argument("--trace", metavar="OUT.json", help="write a Chrome/Perfetto trace: one event per op call")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of tables")
    p.set_defaults(func=_cmd_profile, api_options=("model", "backend", "dtype", "block_size", "max_num_seqs"))


def _workload(args: argparse.Namespace) -> Any:
    from hetero.bench.engine import Workload, parse_range

    n, inputs, outputs = WORKLOADS[args.workload]
    ranges = []
    for option, text in (("--input-len", args.input_len or inputs), ("--output-len", args.output_len or outputs)):
        try:
            ranges.append(parse_range(text))
        except UsageError as e:
            raise UsageError(f"argument {option}: {e}") from e
    return Workload(args.num_requests or n, ranges[0], ranges[1], args.seed)


def _ceilings_override(args: argparse.Namespace) -> dict[str, Any] | None:
    """The --ceilings (or HETERO_BENCH_CEILINGS) file, read and checked before the model loads."""
    from hetero.bench.devices import CeilingsError, load_ceilings, override_from_env

    path = args.ceilings or override_from_env()
    try:
        return load_ceilings(path) if path else None
    except CeilingsError as e:
        raise UsageError(f"argument --ceilings: {e}") from e


def _check_trace(path: str | None) -> None:
    """Before the run: a trace that could not be written is a usage error, not a lost run."""
    if path is None:
        return
    folder = Path(path).parent
    if Path(path).is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK):
        raise UsageError(f"argument --trace: expected a file path in a writable directory, got {path!r}")


def _cmd_profile(args: argparse.Namespace, registry: Any, console: Console) -> int:
    from hetero.bench._timer import torch_threads
    from hetero.bench.devices import device_label, find_ceilings
    from hetero.engine import LLM
    from hetero.engine.config import EngineConfig
    from hetero.tools.profile import profile_run
    from hetero.tools.profile.table import print_report

    workload = _workload(args)
    _check_trace(args.trace)
    override = _ceilings_override(args)
    name = (args.backend or registry.select()).split(":")[0]
    device_name = registry.availability(name).device_name
    cfg = EngineConfig(
        model=args.model,
        backend=args.backend,
        dtype=args.dtype or "auto",
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        seed=args.seed,
    ).resolve()
    if workload.max_len > cfg.max_model_len:
        raise UsageError(
            f"arguments --input-len/--output-len: sequences of up to {workload.max_len} tokens, "
            f"longer than the model's {cfg.max_model_len} (max_position_embeddings)"
        )
    with torch_threads(args.threads):
        llm = LLM(
            args.model,
            backend=args.backend,
            dtype=cfg.dtype,
            block_size=args.block_size,
            max_num_seqs=args.max_num_seqs,
            seed=args.seed,
        )
        ceilings, note = find_ceilings(device_label(llm.runner.device, device_name), override)
        report = profile_run(
            llm, workload, warmup=args.warmup, ceilings=ceilings, ceilings_note=note, device_name=device_name
        )
    report.run.update(backend=name, model=str(args.model), dtype=llm.config.dtype)
    if args.trace:
        report.write_trace(args.trace)
    if args.json:
        print(json.dumps(report.as_dict(), indent=1))
    else:
        print_report(console, report, f"hetero profile: {args.model} on {name} ({llm.config.dtype}), {report.device}")
        if args.trace:
            console.print(f"trace: {args.trace} ({len(report.calls)} op events)", highlight=False, markup=False)
    return EXIT_OK
