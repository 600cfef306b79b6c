"""``hetero generate``, ``hetero check-model``, ``hetero bench-engine`` and ``hetero quantize``:
the engine on the command line."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console

from hetero.errors import UsageError
from hetero.tools import _cli_common
from hetero.tools._check_cli import add_check_parser
from hetero.tools._cli_common import EXIT_OK, compile_arg, model_args, show_quantization, speculative_arg, token_ids

__all__ = ["add_parsers"]

# SamplingParams / EngineConfig fields each command passes on from its option of the same name
_GENERATE_API = (
    "model",
    "backend",
    "dtype",
    "block_size",
    "max_num_seqs",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "compile",
    "speculative_config",
    "max_tokens",
    "temperature",
    "top_k",
    "top_p",
    "seed",
    "logprobs",
)
_BENCH_API = (
    "model",
    "backend",
    "dtype",
    "block_size",
    "max_num_seqs",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "compile",
    "speculative_config",
    "num_requests",
)


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "generate",
        help="run a Hugging Face checkpoint through the reference engine",
        description="Generate from a checkpoint directory (config.json + safetensors). Prompts are text "
        "(needs the checkpoint's tokenizer) or token ids; one request per --prompt/--prompt-ids.",
    )
    p.add_argument("--model", required=True, metavar="DIR", help="checkpoint directory")
    model_args(p)
    p.add_argument("--prompt", action="append", default=[], metavar="TEXT", help="a text prompt (repeatable)")
    p.add_argument(
        "--prompt-ids",
        action="append",
        default=[],
        type=token_ids,
        metavar="IDS",
        help='token ids, e.g. "1 2 3" (repeatable)',
    )
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="ranks; launch with torchrun --nproc-per-node N")
    _cli_common.pipeline_arg(p)
    p.add_argument(
        "--expert-parallel", action="store_true", help="split MoE experts over the ranks instead of their columns"
    )
    compile_arg(p)
    speculative_arg(p)
    p.add_argument(
        "--logprobs",
        type=int,
        default=None,
        metavar="K",
        help="report the K most likely tokens' logprobs (and the sampled one's) at each generated token, "
        "from the logits before any sampling transform",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per request (token_ids, logprobs with --logprobs, text with a tokenizer, and "
        "spec_decode: {num_draft_tokens, num_accepted_tokens} with --speculative-config)",
    )
    p.set_defaults(func=_cmd_generate, api_options=_GENERATE_API)
    add_check_parser(sub)
    _add_bench_parser(sub)
    _add_quantize_parser(sub)


def _add_quantize_parser(sub: Any) -> None:
    from hetero.tools.quantize import SCHEMES

    p = sub.add_parser(
        "quantize",
        help="write an 8-bit (fp8 / int8) or W4A16 (int4) copy of a float checkpoint",
        description="Quantize every Linear weight of a bf16/fp32 Hugging Face checkpoint except "
        "embeddings, norms, routers and lm_head. fp8-block: DeepSeek/Qwen3-FP8 layout "
        "(quant_method fp8, 128x128 weight_scale_inv); fp8-channel / int8-channel: "
        "compressed-tensors W8A8 with per-channel weight_scale and dynamic per-token "
        "activations; w4a16-g128 / w4a16-g32 (-asym: with zero points): compressed-tensors pack-quantized "
        "int4 weights in groups, written by the compressed-tensors package, activations in float. "
        "--dequantize writes the float checkpoint a quantized one means.",
    )
    p.add_argument("src", metavar="SRC", help="source checkpoint directory")
    p.add_argument("dst", metavar="DST", help="output directory")
    p.add_argument("--scheme", choices=SCHEMES, help="quantization scheme (required unless --dequantize)")
    p.add_argument(
        "--scale-dtype",
        default="float32",
        choices=("float32", "bfloat16", "float16"),
        help="dtype of the stored scales (default float32)",
    )
    p.add_argument(
        "--scale-fmt",
        default="float",
        choices=("float", "ue8m0"),
        help="fp8-block: activation scales as powers of two (DeepSeek-V3.1+ scale_fmt)",
    )
    p.add_argument("--dequantize", action="store_true", help="write SRC's dequantized float32 copy instead")
    p.set_defaults(func=_cmd_quantize, needs_registry=False)


def _cmd_quantize(args: argparse.Namespace, registry: Any, console: Console) -> int:
    import torch

    from hetero.tools.quantize import SCHEMES, dequantize_checkpoint, quantize_checkpoint

    if args.dequantize:
        done = dequantize_checkpoint(args.src, args.dst)
        console.print(f"{args.dst}: {len(done['converted'])} weights dequantized to float32", highlight=False)
        return EXIT_OK
    if args.scheme is None:
        raise UsageError(f"argument --scheme: expected one of {', '.join(SCHEMES)}, got none")
    done = quantize_checkpoint(
        args.src, args.dst, args.scheme, scale_dtype=getattr(torch, args.scale_dtype), scale_fmt=args.scale_fmt
    )
    console.print(
        f"{args.dst}: {len(done['converted'])} weights quantized ({args.scheme}), "
        f"{len(done['kept'])} kept in float: {', '.join(done['kept'][:6])}"
        f"{' ...' if len(done['kept']) > 6 else ''}",
        highlight=False,
    )
    return EXIT_OK


def _add_bench_parser(sub: Any) -> None:
    p = sub.add_parser(
        "bench-engine",
        help="throughput and latency of the engine on a synthetic workload",
        description="Submit N requests at once (random prompt tokens, greedy, EOS ignored; prompt and "
        "output lengths uniform in the ranges, seeded) after a warm-up, and report request "
        "and token throughput, TTFT/TPOT/end-to-end percentiles, KV-cache utilization, "
        "preemptions and prefix-cache hits. --compare exits 1 naming every metric more than "
        "--threshold worse than the baseline (after one re-run), 2 when the baseline's "
        "backend, device, model, workload or engine settings differ.",
    )
    p.add_argument("--model", required=True, metavar="DIR", help="checkpoint directory")
    model_args(p)
    p.add_argument("--num-requests", type=int, default=64, metavar="N")
    p.add_argument(
        "--input-len", default="32:256", metavar="MIN:MAX", help="prompt lengths, inclusive (default 32:256)"
    )
    p.add_argument(
        "--output-len", default="32:128", metavar="MIN:MAX", help="output lengths, inclusive (default 32:128)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the lengths and prompt tokens (default 0)")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="ranks; launch with torchrun --nproc-per-node N")
    _cli_common.pipeline_arg(p)
    compile_arg(p)
    speculative_arg(p)
    p.add_argument("--warmup", type=int, default=2, metavar="N", help="warm-up requests before measuring (default 2)")
    p.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="torch CPU threads for the run (default: torch's own); "
        "part of a CPU's baseline key, fewer are steadier on a shared machine",
    )
    p.add_argument("--json", metavar="F", help="write workload, config, environment and metrics to F")
    p.add_argument("--save", metavar="BASELINE", help="save the compared metrics as a baseline file")
    p.add_argument("--compare", metavar="BASELINE", help="compare with a baseline saved by --save")
    p.add_argument(
        "--threshold", type=float, default=0.1, help="relative change that counts as a regression (default 0.1)"
    )
    p.set_defaults(func=_cmd_bench_engine, api_options=_BENCH_API)


def _cmd_bench_engine(args: argparse.Namespace, registry: Any, console: Console) -> int:
    from hetero.bench._timer import torch_threads
    from hetero.bench.engine_report import bench_engine

    if args.threads is not None and args.threads < 1:
        raise UsageError(f"argument --threads: expected an integer >= 1, got {args.threads}")
    show_quantization(args)
    with torch_threads(args.threads):
        return bench_engine(args, registry, console)


def _cmd_generate(args: argparse.Namespace, registry: Any, console: Console) -> int:
    from hetero.engine import LLM, SamplingParams

    prompts: list[Any] = list(args.prompt) + list(args.prompt_ids)
    if not prompts:
        raise UsageError("arguments --prompt/--prompt-ids: expected at least one prompt, got none")
    if args.logprobs is not None and args.logprobs < 0:
        raise UsageError(f"argument --logprobs: expected an integer >= 0, got {args.logprobs}")
    params = SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        seed=args.seed,
        ignore_eos=args.ignore_eos,
        logprobs=args.logprobs,
    )
    show_quantization(args)
    llm = LLM(
        args.model,
        backend=args.backend,
        dtype=args.dtype or "auto",
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        tensor_parallel_size=args.tensor_parallel_size,
        expert_parallel=args.expert_parallel,
        pipeline_parallel_size=args.pipeline_parallel_size,
        pp_layer_partition=args.pp_layer_partition,
        compile=args.compile,
        speculative_config=args.speculative_config,
    )
    outputs = llm.generate(prompts, params)
    if llm.world.size > 1:
        import torch.distributed as dist

        dist.barrier()  # leave together: a rank exiting early can abort its peers' gloo group
        dist.destroy_process_group()
    if llm.rank != 0:
        return EXIT_OK
    for out in outputs:
        if args.json:
            print(json.dumps(_generated_record(out), allow_nan=False))
        else:
            _print_generated(console, out)
    return EXIT_OK


#: JSON has no -inf: a token the logits rule out (logprob -inf) is written as this, as OpenAI-style servers do
_JSON_NEG_INF = -9999.0


def _generated_record(out: Any) -> dict[str, Any]:
    """One request's ``--json`` object; ``logprobs``: per generated token, its entries in rank order."""
    record: dict[str, Any] = {
        "request_id": out.request_id,
        "prompt_token_ids": list(out.prompt_token_ids),
        "token_ids": list(out.token_ids),
        "finish_reason": out.finish_reason,
    }
    if out.text is not None:
        record["text"] = out.text
    if "spec_decode" in out.metrics:
        record["spec_decode"] = dict(out.metrics["spec_decode"])
    if out.logprobs is not None:
        record["logprobs"] = [
            [
                {"token_id": t, "logprob": max(lp.logprob, _JSON_NEG_INF), "rank": lp.rank}
                for t, lp in sorted(entry.items(), key=lambda e: e[1].rank)
            ]
            for entry in out.logprobs
        ]
    return record


def _print_generated(console: Console, out: Any) -> None:
    shown = out.text if out.text is not None else " ".join(map(str, out.token_ids))
    console.print(f"[bold]{out.request_id}[/] ({out.finish_reason}): {shown}", highlight=False)
    for i, (token, entry) in enumerate(zip(out.token_ids, out.logprobs or ())):
        ranked = ", ".join(f"{t} {lp.logprob:.3f} #{lp.rank}" for t, lp in entry.items())
        console.print(f"  {i}: {token} <- {ranked}", highlight=False)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use the `hetero` command")
