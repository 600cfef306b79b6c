"""``hetero serve`` and ``hetero bench-serve``: the OpenAI-compatible server and its load generator."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from hetero.errors import UsageError
from hetero.tools._cli_common import EXIT_OK, compile_arg, model_args, pipeline_arg, speculative_arg

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    """``serve`` and ``bench-serve``."""
    from hetero.bench.serve_cli import add_bench_parser

    _add_serve_parser(sub)
    add_bench_parser(sub)


def _add_serve_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a checkpoint behind an OpenAI-compatible HTTP API",
        description="Serve a checkpoint directory: /v1/completions, /v1/chat/completions (with a "
        "tokenizer and chat template), /v1/models, /health and /metrics (Prometheus).",
    )
    p.add_argument("--model", default=None, metavar="DIR", help="checkpoint directory")
    model_args(p)
    p.add_argument("--served-model-name", default=None, help="the model id clients send (default: the directory name)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="ranks; launch with torchrun --nproc-per-node N (rank 0 serves)",
    )
    p.add_argument("--expert-parallel", action="store_true", help="split MoE experts over the ranks")
    pipeline_arg(p)
    compile_arg(p)
    speculative_arg(p)
    p.add_argument(
        "--api-key",
        default=os.environ.get("HETERO_API_KEY") or None,
        help="require 'Authorization: Bearer KEY' on /v1/ requests (default: $HETERO_API_KEY)",
    )
    p.add_argument(
        "--kv-events-config",
        default=None,
        metavar="JSON",
        help="publish KV events as vLLM does, for vllm-router's kv_aware policy: e.g. '{\"enable_kv_cache_events\": "
        'true, "publisher": "zmq", "endpoint": "tcp://*:5557"}\'',
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="on SIGTERM: refuse new requests (503) and let the running ones finish for up to S seconds",
    )
    pd = p.add_argument_group("prefill/decode disaggregation")
    pd.add_argument(
        "--role",
        choices=("prefill", "decode"),
        default=None,
        help="prefill: compute prompts' caches and hold them for decode instances; decode: pull them and "
        "generate (vllm-router --vllm-pd-disaggregation fronts both; default: serve alone)",
    )
    pd.add_argument(
        "--kv-transfer-addr",
        default=None,
        metavar="HOST:PORT",
        help="prefill: where decode instances link to this one to pull caches",
    )
    pd.add_argument(
        "--kv-link-secret",
        default=os.environ.get("HETERO_KV_LINK_SECRET") or None,
        help="prefill and decode: the secret both ends of a KV link prove (default: $HETERO_KV_LINK_SECRET)",
    )
    p.set_defaults(func=_cmd_serve)


def _check_role(args: argparse.Namespace) -> None:
    need = {
        "prefill": ("model", "kv_transfer_addr"),
        "decode": ("model",),
        None: ("model",),
    }[args.role]
    for name in need:
        if getattr(args, name) is None:
            role = f"--role {args.role}" if args.role else "serving"
            raise UsageError(f"{role} needs --{name.replace('_', '-')}", arg=f"--{name}", expected="a value", got=None)
    if args.kv_transfer_addr is not None:
        from hetero.serve.pd.link import parse_addr

        if args.role != "prefill":
            raise UsageError(
                "--kv-transfer-addr is where a prefill instance takes KV links; a decode instance dials the prefill "
                "instances its requests name",
                arg="--kv-transfer-addr",
                expected="--role prefill",
                got=args.role,
            )
        parse_addr(args.kv_transfer_addr)


def _cmd_serve(args: argparse.Namespace, registry: Any, console: Any) -> int:
    import uvicorn

    from hetero.engine import LLM
    from hetero.serve.app import build_app
    from hetero.serve.drain import DrainingServer
    from hetero.serve.engine_loop import follow
    from hetero.serve.kv_events import KVEventPublisher, KVEventsConfig
    from hetero.serve.metrics import ServerMetrics

    _check_role(args)
    events_config = KVEventsConfig.parse(args.kv_events_config)  # refused before the model loads
    extra = {"max_model_len": args.max_model_len} if args.max_model_len else {}
    llm = LLM(
        args.model,
        backend=args.backend,
        dtype=args.dtype or "auto",
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        seed=args.seed,
        compile=args.compile,
        speculative_config=args.speculative_config,
        tensor_parallel_size=args.tensor_parallel_size,
        expert_parallel=args.expert_parallel,
        pipeline_parallel_size=args.pipeline_parallel_size,
        pp_layer_partition=args.pp_layer_partition,
        **extra,
    )
    if llm.rank != 0:
        follow(llm)
        return EXIT_OK
    name = args.served_model_name or Path(args.model).resolve().name
    metrics, pd = ServerMetrics(name), None
    kv_events = KVEventPublisher(events_config) if events_config is not None else None
    if args.role is not None:
        import socket

        from hetero.serve.pd import open_role

        who = f"{socket.gethostname()}:{args.port}"
        pd = open_role(llm, args.role, args.kv_transfer_addr, metrics.registry, args.kv_link_secret, who)
    links = f", KV links at {args.kv_transfer_addr}" if args.role == "prefill" else ""
    role = f" as a {args.role} instance{links}" if args.role else ""
    console.print(
        f"serving {name} (backend {args.backend or 'auto'}){role} on http://{args.host}:{args.port}/v1", highlight=False
    )
    app = build_app(llm, name, pd, metrics, kv_events=kv_events, api_key=args.api_key)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning")
    DrainingServer(config, app, args.drain_timeout).run()
    return EXIT_OK
