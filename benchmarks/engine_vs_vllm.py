"""hetero's engine beside vLLM and transformers: output tok/s and greedy tokens, dense and MoE, in one run.

    .venv/bin/python benchmarks/engine_vs_vllm.py [--quick] [--json F] [--configs A,B] [--models qwen3,qwen3_moe]
    .venv/bin/python benchmarks/engine_vs_vllm.py --device cuda [--vllm-python PY]     (on a GPU machine)

The checkpoints, the workload and vLLM's worker are benchmarks/vllm_route.py's: two random
float32 Qwen3 (dense and MoE, 8 layers, hidden 512, vocabulary 256), N requests with prompt and
output lengths uniform in [16, 128), greedy, EOS ignored; the same engine settings (block 32,
max_model_len 256, 64 sequences, 2048 tokens a step). Every config runs in its own process,
started and warmed up untimed, then times ``--inner`` workloads (seeds seed, seed+1, ...):

- hetero-* : ``hetero.engine.LLM`` on a backend, ``compile=True`` for the compiled ones
  (``HETERO_VALIDATE=0``: index-content checks off, as vLLM checks none);
- vllm-eager / vllm-compiled: stock vLLM (``enforce_eager`` or its default compilation) run by
  ``--vllm-python`` (default .venv-vllm/bin/python) through vllm_route.py's ``--worker``;
- hf-batched: transformers ``generate`` on one left-padded batch of all requests, each request's
  own tokens cut to its length (the batch runs until its longest request is done).

Repeats are interleaved (every config once, then again), so load biases all alike. Each cell is
the best output tok/s (median beside); tokens are compared per request with vLLM eager's (else
hetero cpu_ref's, else the first config's). A config that cannot start here is reported
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
import vllm_route  # noqa: E402  (sibling scripts, not a package)
from _engine_report import model_rows, report  # noqa: E402

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


def workload(requests: int, vocab: int, seed: int, max_tokens: int | None) -> tuple[list[list[int]], list[int]]:
    """vllm_route's workload, output lengths capped at ``max_tokens`` when given (hetero and hf workers only)."""
    prompts, out_lens = vllm_route.workload(requests, vocab, seed)
    return prompts, [min(m, max_tokens or m) for m in out_lens]


def hetero_worker(
    config: Config, model: str, device: str, requests: int, seed: int, inner: int, max_tokens: int | None = None
) -> dict:
    """Start ``hetero.engine.LLM`` on the config's backend, warm up, time ``inner`` workloads."""
    import torch

    from hetero.engine import LLM, SamplingParams

    extra = {"compile": True} if config.compiled else {}
    start = time.perf_counter()
    try:
        llm = LLM(model, backend=config.backend, dtype="float32", device=device, **vllm_route._ENGINE, **extra)
    except Exception as e:  # noqa: BLE001  (a config this machine or this hetero cannot start is reported, not fatal)
        return {"unavailable": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
    result = _result(time.perf_counter() - start, torch.get_num_threads())
    vocab = llm.config.hf_config.vocab_size
    # batches of 4 down to 1 over several lengths: a compiled config builds all its graphs here
    warm, _ = vllm_route.workload(4, vocab, seed + 1000)
    llm.generate(warm, [SamplingParams(max_tokens=8 * (i + 1)) for i in range(4)], progress=False)
    for i in range(inner):
        prompts, out_lens = workload(requests, vocab, seed + i, max_tokens)
        params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in out_lens]
        start = time.perf_counter()
        outs = llm.generate(prompts, params, progress=False)
        _record(result, time.perf_counter() - start, [list(o.token_ids) for o in outs])
    return result


def hf_worker(model: str, device: str, requests: int, seed: int, inner: int, max_tokens: int | None = None) -> dict:
    """transformers ``generate`` on one left-padded batch per workload; each request's own tokens count."""
    import torch
    import transformers

    from hetero.tools.check import greedy_generation_config

    start = time.perf_counter()
    hf = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).to(device).eval()
    result = _result(time.perf_counter() - start, torch.get_num_threads())
    with torch.inference_mode():
        warm, warm_lens = vllm_route.workload(2, hf.config.vocab_size, seed + 1000)
        _hf_batch(hf, warm, [8, 8], device, greedy_generation_config)
        for i in range(inner):
            prompts, out_lens = workload(requests, hf.config.vocab_size, seed + i, max_tokens)
            start = time.perf_counter()
            tokens = _hf_batch(hf, prompts, out_lens, device, greedy_generation_config)
            _record(result, time.perf_counter() - start, tokens)
    return result


def _hf_batch(hf, prompts: list[list[int]], out_lens: list[int], device: str, generation_config) -> list[list[int]]:
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    out = hf.generate(ids, attention_mask=mask, generation_config=generation_config(hf, max(out_lens))).tolist()
    return [row[width : width + m] for row, m in zip(out, out_lens)]


def _result(init_s: float, threads: int) -> dict:
    return {"init_s": init_s, "torch_threads": threads, "seconds": [], "rates": [], "tokens": [], "load": []}


def _record(result: dict, seconds: float, tokens: list[list[int]]) -> None:
    result["seconds"].append(seconds)
    result["rates"].append(sum(map(len, tokens)) / seconds)
    result["load"].append(os.getloadavg()[0])
    result["tokens"] += tokens


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


def run_once(config: Config, model: Path, args, scratch: Path) -> dict:
    """One subprocess run of ``config`` on ``model``: its worker's JSON, or {"failed": ...} / {"unavailable": ...}."""
    if config.engine == "vllm" and args.vllm is None:
        return {"unavailable": args.vllm_versions}
    out = scratch / f"{model.name}-{config.name}-{time.monotonic_ns()}.json"
    if config.engine == "vllm":
        cmd = vllm_route.worker_command(model, out, config.compiled, args.requests, args.seed, args.inner, args.vllm)
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
        for _ in range(args.repeats):
            for c in configs:
                if runs[c.name] and "seconds" not in runs[c.name][-1]:
                    continue  # unavailable or failed once: not tried again
                runs[c.name].append(run_once(c, model, args, scratch))
                print(f"  {name} {c.name}: {_log(runs[c.name][-1])}", flush=True)
        rows += model_rows(name, configs, runs)
    return rows


def _log(run: dict) -> str:
    if "seconds" not in run:
        return f"unavailable: {run['unavailable']}" if "unavailable" in run else f"FAILED: {run['failed']}"
    times = ", ".join(f"{t:.2f}" for t in run["seconds"])
    return (
        f"{times} s (start {run['init_s']:.1f} s, torch threads {run['torch_threads']}, "
        f"1-min load {max(run['load']):.1f})"
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=sorted(CONFIGS), help="cpu, or cuda on a GPU machine")
    p.add_argument("--configs", help="comma-separated config names (default: all of --device's)")
    p.add_argument("--models", default="qwen3,qwen3_moe", help="comma-separated: qwen3, qwen3_moe")
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
    if set(args.models) - {"qwen3", "qwen3_moe"} or min(args.requests, args.repeats, args.inner) < 1:
        p.error(
            f"--models takes qwen3,qwen3_moe and --requests, --repeats, --inner at least 1; "
            f"got {','.join(args.models)}, {args.requests}, {args.repeats}, {args.inner}"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.worker:
        config = next(c for c in args.configs if c.name == args.worker[0])
        run = (args.worker[1], args.device, args.requests, args.seed, args.inner, args.max_tokens)
        result = hf_worker(*run) if config.engine == "hf" else hetero_worker(config, *run)
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
    with tempfile.TemporaryDirectory() as d:
        models = vllm_route.write_models(Path(d), tuple(args.models))
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
