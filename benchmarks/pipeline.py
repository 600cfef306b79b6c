"""Pipeline parallelism beside one process: throughput, per-rank memory and the bubble, measured side by side.

    .venv/bin/python benchmarks/pipeline.py [--models qwen3,qwen3-0.6b] [--requests 16] [--input-len 64]
        [--output-len 32] [--repeats 2] [--partition 15,13] [--markdown F] [--json F]

Targets: engine_vs_vllm.py's checkpoints (``_workloads.MODELS``: a tiny float32 Qwen3 of 8 layers and
Qwen3-0.6B's shape in bfloat16, 28 layers, random weights). Per target, interleaved over the repeats, every
config runs the same workload (``--requests`` random prompts of ``--input-len`` tokens, greedy, EOS ignored,
``--output-len`` tokens each, all submitted at once, after one warm-up request) on the torch backend:

- PP=1 on one process with one thread, and with as many threads as PP=2 has processes (the same cores);
- PP=2 under torchrun (two processes, one thread each), micro-batching on (two micro-batches in flight)
  and off (``pipeline_microbatches=1``: one step in the pipeline at a time, the other stage idle).

Each row: output tok/s (median of the repeats) and its ratio to PP=1 on one thread, per rank the resident
weight bytes and KV-cache bytes, and per rank the bubble: the fraction of the run a rank spent in the
tick's transfers (waiting on the other stage included) rather than in its own forward, from the
pipeline's own counters (``MicroBatchPipeline.compute_s`` / ``transfer_s``). Tokens are checked against
PP=1's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

CONFIGS = (("PP=1, 1 thread", 1, 1, None), ("PP=1, 2 threads", 1, 2, None))
CONFIGS += (("PP=2, micro-batching on", 2, 1, None), ("PP=2, micro-batching off", 2, 1, 1))


def _prompts(n: int, length: int, vocab: int) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(0)
    return [rng.integers(3, vocab, length).tolist() for _ in range(n)]


def worker(spec_path: str) -> None:
    """One config's run (under torchrun for PP > 1); rank r writes its record to spec["out"].r."""
    import torch

    from hetero.engine import LLM, SamplingParams

    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(spec["threads"])
    llm = LLM(**spec["engine"])
    params = SamplingParams(temperature=0.0, max_tokens=spec["output_len"], ignore_eos=True)
    llm.generate(spec["prompts"][:1], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True), progress=False)
    pipe = llm.pipeline
    if pipe is not None:
        pipe.compute_s = pipe.transfer_s = 0.0
    start = time.perf_counter()
    outs = llm.generate(spec["prompts"], params, progress=False)
    elapsed = time.perf_counter() - start
    pools = llm.runner.cache
    record = {
        "seconds": elapsed,
        "tokens": [list(o.token_ids) for o in outs],
        "weight_bytes": sum({id(p): p.numel() * p.element_size() for p in llm.runner.model.parameters()}.values()),
        "kv_bytes": sum(t.numel() * t.element_size() for t in [*pools.paged.values(), *pools.state.values()]),
        "bubble": None if pipe is None else pipe.transfer_s / max(pipe.compute_s + pipe.transfer_s, 1e-9),
    }
    Path(f"{spec['out']}.{llm.rank}").write_text(json.dumps(record))
    if llm.world.size > 1:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()


def _run(spec: dict, pp: int, root: Path) -> list[dict]:
    from hetero.distributed import free_port

    spec_path = root / "spec.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [sys.executable, __file__, "--worker", str(spec_path)]
    if pp > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(pp), "--master-addr"]
        cmd += ["127.0.0.1", "--master-port", str(free_port()), __file__, "--worker", str(spec_path)]
    env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"])}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return [json.loads(Path(f"{spec['out']}.{r}").read_text()) for r in range(pp)]


def measure(args: argparse.Namespace) -> list[dict]:
    import _workloads

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = _workloads.write(root, args.models)
        for name in args.models:
            model = _workloads.MODELS[name]
            vocab = 151936 if model.real else 256
            prompts = _prompts(args.requests, args.input_len, vocab)
            engine = dict(model=str(paths[name]), backend="torch", dtype=model.dtype, max_num_seqs=args.requests)
            configs = list(CONFIGS)
            if args.partition:
                configs.append((f"PP=2, partition {args.partition}", 2, 1, None))
            runs: dict[str, list[list[dict]]] = {c[0]: [] for c in configs}
            for _ in range(args.repeats):
                for label, pp, threads, microbatches in configs:
                    extra = {"pipeline_parallel_size": pp} if pp > 1 else {}
                    if microbatches:
                        extra["pipeline_microbatches"] = microbatches
                    if label.startswith("PP=2, partition"):
                        extra["pp_layer_partition"] = args.partition
                    spec = dict(engine=dict(engine, **extra), threads=threads, prompts=prompts)
                    spec.update(output_len=args.output_len, out=str(root / "out.json"))
                    runs[label].append(_run(spec, pp, root))
            base_tokens = runs[CONFIGS[0][0]][0][0]["tokens"]
            for label, pp, threads, _ in configs:
                tps = [args.requests * args.output_len / ranks[0]["seconds"] for ranks in runs[label]]
                last = runs[label][-1]
                rows.append(
                    dict(
                        model=name,
                        config=label,
                        tok_s=statistics.median(tps),
                        weight_mb=[r["weight_bytes"] / 2**20 for r in last],
                        kv_mb=[r["kv_bytes"] / 2**20 for r in last],
                        bubble=[r["bubble"] for r in last] if pp > 1 else None,
                        same_tokens=last[0]["tokens"] == base_tokens,
                    )
                )
            base = rows[-len(configs)]["tok_s"]
            for row in rows[-len(configs) :]:
                row["ratio"] = row["tok_s"] / base
    return rows


def markdown(rows: list[dict], command: str) -> str:
    def mb(values):
        return " / ".join(f"{v:.1f}" for v in values)

    lines = [f"`{command}`", "", "| model | config | output tok/s | vs PP=1, 1 thread | weights MiB per rank "]
    lines[-1] += "| KV MiB per rank | bubble per rank | tokens = PP=1 |"
    lines.append("|---|---|---|---|---|---|---|---|")
    for r in rows:
        bubble = " / ".join(f"{b:.0%}" for b in r["bubble"]) if r["bubble"] else "-"
        lines.append(
            f"| {r['model']} | {r['config']} | {r['tok_s']:.1f} | {r['ratio']:.2f}x | {mb(r['weight_mb'])} | "
            f"{mb(r['kv_mb'])} | {bubble} | {'yes' if r['same_tokens'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--models", default="qwen3,qwen3-0.6b")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--partition", help="one more PP=2 row with this pp_layer_partition (e.g. 15,13)")
    p.add_argument("--markdown")
    p.add_argument("--json")
    args = p.parse_args()
    if args.worker:
        return worker(args.worker)
    args.models = args.models.split(",")
    rows = measure(args)
    command = "python benchmarks/pipeline.py " + " ".join(sys.argv[1:])
    text = markdown(rows, command.strip())
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
