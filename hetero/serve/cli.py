"""``hetero serve`` and ``hetero bench-serve``: the OpenAI-compatible server and its load generator."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hetero.engine._cli_common import EXIT_OK, compile_arg, model_args

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    """``serve`` and ``bench-serve``."""
    from hetero.serve._bench_cli import add_bench_parser

    _add_serve_parser(sub)
    add_bench_parser(sub)


def _add_serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve a checkpoint behind an OpenAI-compatible HTTP API",
                       description="Serve a checkpoint directory: /v1/completions, /v1/chat/completions (with a "
                                   "tokenizer and chat template), /v1/models, /health and /metrics (Prometheus).")
    p.add_argument("--model", required=True, metavar="DIR", help="checkpoint directory")
    model_args(p)
    p.add_argument("--served-model-name", default=None, help="the model id clients send (default: the directory name)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="ranks; launch with torchrun --nproc-per-node N (rank 0 serves)")
    p.add_argument("--expert-parallel", action="store_true", help="split MoE experts over the ranks")
    compile_arg(p)
    p.set_defaults(func=_cmd_serve)


def _cmd_serve(args: argparse.Namespace, registry: Any, console: Any) -> int:
    import uvicorn

    from hetero.engine import LLM
    from hetero.serve.app import build_app
    from hetero.serve.engine_loop import follow

    extra = {"max_model_len": args.max_model_len} if args.max_model_len else {}
    llm = LLM(args.model, backend=args.backend, dtype=args.dtype or "auto", block_size=args.block_size,
              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens, seed=args.seed,
              compile=args.compile, tensor_parallel_size=args.tensor_parallel_size,
              expert_parallel=args.expert_parallel, **extra)
    if llm.rank != 0:
        follow(llm)
        return EXIT_OK
    name = args.served_model_name or Path(args.model).resolve().name
    console.print(f"serving {name} (backend {args.backend or 'auto'}) on http://{args.host}:{args.port}/v1", highlight=False)
    uvicorn.run(build_app(llm, name), host=args.host, port=args.port, log_level="warning")
    return EXIT_OK
