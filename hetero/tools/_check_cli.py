"""``hetero check-model``: the command line of ``hetero.tools.check`` and, with --per-op, ``hetero.tools.replay``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from hetero.errors import UsageError
from hetero.tools._cli_common import EXIT_FAIL, EXIT_OK, model_args, pipeline_arg, show_quantization, token_ids

__all__ = ["add_check_parser"]


def add_check_parser(sub: Any) -> None:
    p = sub.add_parser(
        "check-model",
        help="compare a checkpoint on a backend with transformers, layer by layer",
        description="Run the checkpoint through hetero and through transformers on the same prompts: "
        "per-layer hidden-state error (where an error starts), final logits error, greedy-token "
        "agreement and, at the first difference, whether each token is in the other's top-k. "
        "--per-op also records the engine's op calls and replays each on the reference in "
        "float64 under conformance's tolerance, naming the first op call out of bounds (or "
        "accumulated rounding when none is). Exit 1 when a layer exceeds the tolerance, greedy "
        "tokens diverge outside the top-k, or (--per-op) an op call is out of bounds.",
    )
    p.add_argument("model", metavar="DIR", help="checkpoint directory run through hetero")
    model_args(p)
    p.add_argument(
        "--reference",
        metavar="DIR",
        help="checkpoint transformers runs (default: DIR itself), e.g. the original of a converted one",
    )
    p.add_argument(
        "--prompt-ids",
        action="append",
        default=[],
        type=token_ids,
        metavar="IDS",
        help='token ids, e.g. "1 2 3" (default: 3 random prompts)',
    )
    p.add_argument(
        "--max-tokens", type=int, default=16, help="greedy tokens compared per prompt (0: layers and logits only)"
    )
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument(
        "--tolerance",
        type=float,
        default=None,
        metavar="REL",
        help="relative L2 error a layer may reach (default: per dtype, 5e-2 with 8-bit activations)",
    )
    p.add_argument(
        "--per-op", action="store_true", help="replay the run's op calls on the reference (which op is wrong)"
    )
    p.add_argument(
        "--per-op-samples", type=int, default=4, metavar="N", help="recorded calls per op call site (default 4)"
    )
    p.add_argument(
        "--per-op-max-mb", type=float, default=1024, metavar="MB", help="cap of the recorded tensors (default 1024)"
    )
    p.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        metavar="N",
        help="ranks (launch with torchrun --nproc-per-node N): greedy generation and --per-op run tensor "
        "parallel, each rank recording and replaying its own calls (rank 0 prints them all); the "
        "layer comparison runs the whole model on each rank",
    )
    pipeline_arg(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_cmd_check_model)


def _print_check(console: Console, report) -> None:
    table = Table(
        title=f"{report.model} on {report.backend} vs transformers ({report.dtype}, tolerance {report.tolerance:g})"
    )
    for col in ("point", "rel L2", "max abs", ""):
        table.add_column(col, justify="right" if col.startswith(("rel", "max")) else "left")
    for row in report.layers:
        mark = (
            "[green]ok[/]"
            if row.ok
            else ("[red]error starts here[/]" if row.name == report.first_bad else "[red]over[/]")
        )
        table.add_row(row.name, f"{row.rel_l2:.2e}", f"{row.max_abs:.2e}", mark)
    console.print(table)
    for d in report.greedy:
        if d.position is None:
            console.print(f"prompt {d.prompt}: {report.num_tokens} greedy tokens identical", highlight=False)
        else:
            verdict = "[green]near-tie[/]" if d.acceptable else "[red]diverged[/]"
            console.print(
                f"prompt {d.prompt}: first difference at token {d.position}: hetero {d.hetero_token} "
                f"(in transformers' top-{report.top_k}: {d.hetero_in_reference_topk}), transformers "
                f"{d.reference_token} (in hetero's top-{report.top_k}: {d.reference_in_hetero_topk}) {verdict}",
                highlight=False,
            )
    where = f"the error starts at {report.first_bad}" if report.first_bad else "every layer within tolerance"
    console.print(
        f"[{'green' if report.passed else 'red'}]{'PASS' if report.passed else 'FAIL'}[/]: {where}", highlight=False
    )


def _cmd_check_model(args: argparse.Namespace, registry: Any, console: Console) -> int:
    from hetero.tools.check import ModelCheck, default_prompts
    from hetero.tools.replay.replayer import finite

    prompts = list(args.prompt_ids) or None
    _check_model_args(args, prompts)
    show_quantization(args)
    check = ModelCheck(
        args.model,
        args.backend,
        dtype=args.dtype or "float32",
        reference_dir=args.reference,
        block_size=args.block_size,
        tolerance=args.tolerance,
        tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=args.pipeline_parallel_size,
        pp_layer_partition=args.pp_layer_partition,
    )
    prompts = prompts or default_prompts(check.vocab_size, exclude=check.media_tokens)
    report = check.run(prompts, max_tokens=args.max_tokens, top_k=args.top_k)
    ranks = _per_op(args, check, prompts) if args.per_op else []
    passed = report.passed and all(r.passed for r in ranks)
    if ranks and ranks[0].rank != 0:
        return EXIT_OK if passed else EXIT_FAIL  # rank 0 prints every rank's report
    if args.json:
        out = report.as_dict()
        if ranks:
            out["per_op"] = ranks[0].as_dict(report.first_bad)
        if len(ranks) > 1:
            out["per_op_ranks"] = [r.as_dict(report.first_bad) for r in ranks]
        print(json.dumps(finite(out), indent=1, allow_nan=False))
    else:
        _print_check(console, report)
        from hetero.tools.replay._print import print_per_op

        for r in ranks:
            print_per_op(console, r, report.first_bad)
    return EXIT_OK if passed else EXIT_FAIL


def _per_op(args: argparse.Namespace, check, prompts: list[list[int]]) -> list:
    """This rank's per-op report; under tensor parallelism on rank 0, every rank's (others: their own only)."""
    from hetero.tools.replay import per_op_check

    report = per_op_check(
        args.model,
        check.ops.name,
        prompts,
        dtype=str(check.dtype).removeprefix("torch."),
        max_tokens=max(args.max_tokens, 1),
        block_size=args.block_size,
        samples=args.per_op_samples,
        max_bytes=int(args.per_op_max_mb * 2**20),
        tensor_parallel_size=args.tensor_parallel_size,
    )
    if args.tensor_parallel_size == 1:
        return [report]
    import torch.distributed as dist

    reports: list = [None] * dist.get_world_size()
    dist.all_gather_object(reports, report)
    return reports if report.rank == 0 else [report]


def _check_model_args(args: argparse.Namespace, prompts: list[list[int]] | None) -> None:
    """What check-model hands to transformers and the engine unchecked; UsageError naming the option."""
    from hetero.engine.config import DTYPES, load_hf_config, text_config

    if args.dtype is not None and args.dtype not in DTYPES:
        raise UsageError(f"argument --dtype: expected one of {', '.join(DTYPES)}, got {args.dtype!r}")
    for option, value, least in (
        ("--max-tokens", args.max_tokens, 0),
        ("--top-k", args.top_k, 1),
        ("--block-size", args.block_size, 1),
        ("--per-op-samples", args.per_op_samples, 1),
        ("--tensor-parallel-size", args.tensor_parallel_size, 1),
        ("--pipeline-parallel-size", args.pipeline_parallel_size, 1),
    ):
        if value < least:
            raise UsageError(f"argument {option}: expected an integer >= {least}, got {value}")
    if args.per_op and args.pipeline_parallel_size > 1:
        raise UsageError(
            "argument --per-op: not supported with --pipeline-parallel-size > 1 (the recorded calls of a step "
            "span the stages); run it with tensor parallelism or in one process"
        )
    for option, value in (("--tolerance", args.tolerance), ("--per-op-max-mb", args.per_op_max_mb)):
        if value is not None and not value > 0:
            raise UsageError(f"argument {option}: expected a number > 0, got {value}")
    vocab = int(text_config(load_hf_config(args.model)).vocab_size)  # the model directory and its architecture, too
    if args.reference is not None and not (Path(args.reference) / "config.json").is_file():
        raise UsageError(
            f"argument --reference: expected a Hugging Face checkpoint directory (with config.json), "
            f"got {args.reference!r}"
        )
    for i, ids in enumerate(prompts or ()):
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise UsageError(
                f"argument --prompt-ids (prompt {i}): expected token ids in [0, vocab_size={vocab}), "
                f"got {', '.join(map(str, bad[:5]))}"
            )
