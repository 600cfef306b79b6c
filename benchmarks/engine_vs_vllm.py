"""hetero's engine beside vLLM and transformers: output tok/s, latency and greedy tokens, dense and MoE, in one run.

    .venv/bin/python benchmarks/engine_vs_vllm.py [--quick] [--json F] [--configs A,B] [--models qwen3,qwen3_moe]
    .venv/bin/python benchmarks/engine_vs_vllm.py --models qwen3-0.6b,qwen3-30b-a3b-x4     (real shapes, bfloat16)
    .venv/bin/python benchmarks/engine_vs_vllm.py --device cuda [--vllm-python PY]     (on a GPU machine)

The models are benchmarks/_workloads.py's: two tiny float32 ones (vllm_route.py's) and two at real models' shapes
in bfloat16, random weights written by transformers' classes. The workload and vLLM's worker are vllm_route.py's:
N requests with prompt and output lengths uniform in [16, 128), greedy, EOS ignored; the same engine settings
(block 32, max_model_len 256, 64 sequences, 2048 tokens a step), in the checkpoint's dtype. Every config runs in
its own process, started and warmed up (start and warm-up/compile seconds reported), then times ``--inner``
workloads (seeds seed, seed+1, ...):

- hetero-* : ``hetero.engine.LLM`` on a backend, ``compile=True`` for the compiled ones
  (``HETERO_VALIDATE=0``: index-content checks off, as vLLM checks none);
- vllm-eager / vllm-compiled: stock vLLM (``enforce_eager`` or its default compilation) run by
  ``--vllm-python`` (default .venv-vllm/bin/python) through vllm_route.py's ``--worker``;
- hf-batched: transformers ``generate`` on one left-padded batch of all requests, each request's
  own tokens cut to its length (the batch runs until its longest request is done).

Repeats are interleaved (every config once, then again), so load biases all alike. Each cell is
the best output tok/s (median beside), with the median TTFT and TPOT over the requests; tokens are compared per
request with vLLM eager's (else hetero cpu_ref's, else the first config's): identical in float32; in bfloat16 also
the first token, and the top-5 rule (up to the first differing token, which must be among the reference's 5 most
likely there; the reference reruns 16 requests untimed for its logprobs). The decode roofline is the fastest
output tok/s the machine's ceilings (``--ceilings`` FILE from ``hetero ceilings``, else measured here) allow a
decode step of the workload's batch (_workloads.decode_roofline). A config that cannot start here is reported
"unavailable" with the reason; exit status 1 when a config crashed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _workloads  # noqa: E402  (sibling scripts, not a package)
import vllm_route  # noqa: E402
from _engine_report import REFERENCES, model_rows, report  # noqa: E402
from _engine_workers import TOP5_REQUESTS, hetero_worker, hf_worker  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Config:
    """One engine configuration: ``engine`` is "hetero", "vllm" or "hf"; ``backend`` is hetero's."""

    name: str
    engine: str
    backend: str | None = None
    compiled: bool = False


CONFIGS = {
    "cpu": (
        Config("hetero-torch", "hetero", "torch"),
        Config("hetero-torch-compiled", "hetero", "torch", True),
        Config("hetero-cpu_ref", "hetero", "cpu_ref"),
        Config("vllm-eager", "vllm"),
        Config("vllm-compiled", "vllm", compiled=True),
        Config("hf-batched", "hf"),
    ),
    "cuda": (
        Config("hetero-cuda", "hetero", "cuda"),
        Config("hetero-cuda-compiled", "hetero", "cuda", True),
        Config("hetero-torch", "hetero", "torch"),
        Config("vllm-eager", "vllm"),
        Config("vllm-compiled", "vllm", compiled=True),
        Config("hf-batched", "hf"),
    ),
}
QUICK = {
    "cpu": "hetero-torch,hetero-cpu_ref,vllm-eager,hf-batched",
    "cuda": "hetero-cuda,hetero-torch,vllm-eager,hf-batched",
}


def vllm_python(args) -> tuple[str | None, str]:
    """(the Python that runs vLLM, its versions) or (None, why vLLM is skipped)."""
    python = args.vllm_python or str(ROOT / ".venv-vllm" / "bin" / "python")
    if not Path(python).exists():
        return None, f"no vLLM python at {python} (--vllm-python)"
    code = "import vllm, torch; print(f'{vllm.__version__} (torch {torch.__version__})')"
    probe = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        return None, f"{python} cannot import vllm: {(probe.stderr.strip().splitlines() or ['?'])[-1]}"
    return python, probe.stdout.strip().splitlines()[-1]


def run_once(config: Config, model: Path, args, scratch: Path, top5: bool = False) -> dict:
    """One subprocess run of ``config`` on ``model``: its worker's JSON, or {"failed": ...} / {"unavailable": ...};
    ``top5``: the worker also records its top-5 ids per position (a reference's run on a bfloat16 model)."""
    if config.engine == "vllm" and args.vllm is None:
        return {"unavailable": args.vllm_versions}
    out = scratch / f"{model.name}-{config.name}-{time.monotonic_ns()}.json"
    if config.engine == "vllm":
        cmd = vllm_route.worker_command(
            model, out, config.compiled, args.requests, args.seed, args.inner, args.vllm, TOP5_REQUESTS * top5
        )
        env = vllm_route.engine_env("stock")
    else:
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            config.name,
            str(model),
            str(out),
            "--device",
            args.device,
            "--configs",
            config.name,
            "--requests",
            str(args.requests),
            "--seed",
            str(args.seed),
            "--inner",
            str(args.inner),
        ]
        cmd += ["--max-tokens", str(args.max_tokens)] if args.max_tokens else []
        cmd += ["--top5"] if top5 else []
        env = {**vllm_route.engine_env("stock"), "HETERO_VALIDATE": "0"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800, cwd=ROOT)
    if proc.returncode != 0 or not out.exists():
        tail = " / ".join(line.strip() for line in proc.stderr.strip().splitlines()[-3:])
        return {"failed": f"rc {proc.returncode}: {tail[-600:]}"}
    return json.loads(out.read_text())


def measure(models: dict[str, Path], configs: list[Config], args, scratch: Path) -> list[dict]:
    """Every model: all configs run once, then again (``--repeats``); one row per (model, config)."""
    rows = []
    for name, model in models.items():
        runs: dict[str, list[dict]] = {c.name: [] for c in configs}
        reduced = _workloads.MODELS[name].dtype != "float32"  # bfloat16: agreement by the top-5 rule
        for repeat in range(args.repeats):
            for c in configs:
                if runs[c.name] and "seconds" not in runs[c.name][-1]:
                    continue  # unavailable or failed once: not tried again
                top5 = reduced and repeat == 0 and c.name in REFERENCES
                runs[c.name].append(run_once(c, model, args, scratch, top5))
                print(f"  {name} {c.name}: {_log(runs[c.name][-1])}", flush=True)
        rows += model_rows(name, configs, runs, roofline=_roofline(model, args))
    return rows


def _roofline(model: Path, args) -> dict | None:
    """The decode roofline of ``model`` at the workload's batch and mean context, on this machine's ceilings."""
    if args.ceilings is None:
        return None
    prompts, out_lens = vllm_route.workload(args.requests, 256, args.seed)
    context = sum(map(len, prompts)) / len(prompts) + sum(out_lens) / len(out_lens) / 2
    batch = min(args.requests, vllm_route._ENGINE["max_num_seqs"])
    return {**_workloads.decode_roofline(model, batch, round(context), args.ceilings), "batch": batch}


def _log(run: dict) -> str:
    if "seconds" not in run:
        return f"unavailable: {run['unavailable']}" if "unavailable" in run else f"FAILED: {run['failed']}"
    times = ", ".join(f"{t:.2f}" for t in run["seconds"])
    return (
        f"{times} s (start {run['init_s']:.1f} s, warm-up {run.get('warmup_s', 0):.1f} s, torch threads "
        f"{run['torch_threads']}, 1-min load {max(run['load']):.1f})"
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=sorted(CONFIGS), help="cpu, or cuda on a GPU machine")
    p.add_argument("--configs", help="comma-separated config names (default: all of --device's)")
    p.add_argument("--models", default="qwen3,qwen3_moe", help=f"comma-separated, of {', '.join(_workloads.MODELS)}")
    p.add_argument(
        "--ceilings",
        type=Path,
        help="the machine's ceilings (`hetero ceilings cpu_ref --out FILE`) for the decode roofline; "
        "default: measured here (not with --quick)",
    )
    p.add_argument("--quick", action="store_true", help=f"8 requests, one repeat, one workload; configs {QUICK['cpu']}")
    p.add_argument("--requests", type=int)
    p.add_argument("--repeats", type=int, default=2, help="processes per config and model, interleaved")
    p.add_argument("--inner", type=int, default=2, help="timed workloads per process (seeds seed, seed+1, ...)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-tokens", type=int, help="cap every output length (a smoke run; not with vLLM configs)")
    p.add_argument("--vllm-python", help="a Python with vLLM (default .venv-vllm/bin/python)")
    p.add_argument("--json", type=Path, help="also write the rows, the command and the machine to this JSON file")
    p.add_argument("--markdown", type=Path, help="also write the command, the machine and the tables to this file")
    p.add_argument("--worker", nargs=3, metavar=("CONFIG", "MODEL", "OUT"), help=argparse.SUPPRESS)
    p.add_argument("--top5", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.inner, args.configs = 1, 1, args.configs or QUICK[args.device]
    args.requests = args.requests or (8 if args.quick else 64)
    known = {c.name: c for c in CONFIGS[args.device]}
    names = args.configs.split(",") if args.configs else list(known)
    if set(names) - set(known):
        p.error(f"--configs takes names from {','.join(known)} (--device {args.device}); got {args.configs}")
    args.configs = [known[n] for n in names]
    if args.max_tokens is not None and (args.max_tokens < 1 or any(c.engine == "vllm" for c in args.configs)):
        p.error(
            f"--max-tokens takes an integer >= 1 and no vllm-* config (vLLM's worker draws its own lengths); "
            f"got {args.max_tokens} with {','.join(names)}"
        )
    args.models = args.models.split(",")
    if set(args.models) - set(_workloads.MODELS) or min(args.requests, args.repeats, args.inner) < 1:
        p.error(
            f"--models takes {','.join(_workloads.MODELS)} and --requests, --repeats, --inner at least 1; "
            f"got {','.join(args.models)}, {args.requests}, {args.repeats}, {args.inner}"
        )
    return args


def ceilings(args) -> dict | None:
    """The --ceilings file, else this machine's measured by hetero ceilings' code (None with --quick)."""
    if args.ceilings is not None:
        from hetero.bench.devices import load_ceilings

        return load_ceilings(args.ceilings)
    if args.quick or args.device != "cpu":
        return None
    import torch

    from hetero.bench.ceilings_cli import measure_ceilings

    return measure_ceilings(torch.device("cpu"), size=1024, copy_mib=64, dtypes=("float32", "bfloat16"))


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.worker:
        c = next(c for c in args.configs if c.name == args.worker[0])
        run = (args.worker[1], args.device, args.requests, args.seed, args.inner, args.max_tokens, args.top5)
        result = hf_worker(*run) if c.engine == "hf" else hetero_worker(c.backend, c.compiled, *run)
        Path(args.worker[2]).write_text(json.dumps(result))
        return 0
    args.vllm, args.vllm_versions = (
        vllm_python(args) if any(c.engine == "vllm" for c in args.configs) else (None, "not asked for")
    )
    print("command:", " ".join([Path(sys.executable).name, *sys.argv]))
    info = {
        **vllm_route.machine(),
        "vllm": args.vllm_versions if args.vllm else "-",
        "1-min load at start": f"{os.getloadavg()[0]:.1f}",
    }
    print("machine:", ", ".join(f"{k} {v}" for k, v in info.items()), flush=True)
    if args.vllm is None and any(c.engine == "vllm" for c in args.configs):
        print(f"vLLM skipped: {args.vllm_versions}")
    args.ceilings = ceilings(args)
    if args.ceilings:
        info["ceilings"] = (
            f"{args.ceilings['tflops']['bfloat16']:.2f} bf16 / {args.ceilings['tflops']['float32']:.2f} fp32 "
            f"TFLOP/s, {args.ceilings['tb_s'] * 1000:.1f} GB/s ({args.ceilings['source']})"
        )
        print("ceilings:", info["ceilings"], flush=True)
    with tempfile.TemporaryDirectory() as d:
        models = _workloads.write(Path(d), args.models)
        rows = measure(models, args.configs, args, Path(d))
    text = report(rows, list(models), args)
    print(text)
    if args.markdown:
        args.markdown.write_text(
            f"# hetero's engine beside vLLM and transformers ({args.device})\n\nCommand: "
            f"`{' '.join([Path(sys.executable).name, *sys.argv])}`\n\nMachine: "
            f"{', '.join(f'{k} {v}' for k, v in info.items())}\n\n{text}\n"
        )
    if args.json:
        args.json.write_text(json.dumps({"command": sys.argv, "machine": info, "rows": rows}, indent=1))
    return 1 if any(r["status"] == "FAILED" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
