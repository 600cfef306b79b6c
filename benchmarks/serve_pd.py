"""One server against a prefill/decode pair behind vllm-router's PD mode, under the same `hetero bench-serve` load.

    .venv/bin/python benchmarks/serve_pd.py [--model DIR] [--prefill-backend torch] [--decode-backend torch]
        [--num-prompts 64] [--input-len 256] [--output-len 32] [--max-concurrency 8] [--rounds 2] [--markdown FILE]

Configs, run in turn ``--rounds`` times (so drift hits each alike), each on fresh processes after a
warm-up load:

- ``single``: one ``hetero serve`` on the decode backend, ``OMP_NUM_THREADS`` = ``--threads``;
- ``pd``: prefill and decode instances (``OMP_NUM_THREADS`` = ``--pd-threads`` each) and
  ``vllm-router --vllm-pd-disaggregation`` in front.

Beside bench-serve's summary it reads the pair's KV transfer counters from the instances' /metrics.
The default model is the engine benchmark's dense Qwen3 (``vllm_route.write_models``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _servers import ROUTER, stopping, wait_up  # noqa: E402

from hetero.distributed import free_port  # noqa: E402


@contextlib.contextmanager
def _servers(commands: list[tuple[list[str], dict]], seconds: float = 600):
    urls = [f"http://127.0.0.1:{free_port()}" for _ in commands]
    with stopping() as procs:
        for (args, env), url in zip(commands, urls):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "hetero.cli", "serve", *args, "--port", url.rsplit(":", 1)[1]],
                    env={**os.environ, **env},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        for proc, url in zip(procs, urls):
            wait_up(proc, url, seconds)
        yield urls


@contextlib.contextmanager
def _pd_router(prefill: str, decode: str, seconds: float = 120):
    port = free_port()
    cmd = [ROUTER, "--port", str(port), "--prometheus-port", str(free_port()), "--vllm-pd-disaggregation"]
    with stopping(30) as procs:
        procs.append(subprocess.Popen([*cmd, "--prefill", prefill, "--decode", decode], stdout=subprocess.DEVNULL))
        url = f"http://127.0.0.1:{port}"
        wait_up(procs[0], url, seconds)
        yield url


def _bench(url: str, args: argparse.Namespace, n: int, out: Path | None) -> dict | None:
    cmd = [
        sys.executable,
        "-m",
        "hetero.cli",
        "bench-serve",
        "--url",
        url,
        "--num-prompts",
        str(n),
        "--random-input-len",
        str(args.input_len),
        "--random-output-len",
        str(args.output_len),
        "--ignore-eos",
        "--max-concurrency",
        str(args.max_concurrency),
        "--seed",
        "1",
    ]
    if out is not None:
        cmd += ["--json", str(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())["summary"] if out is not None else None


def _transfer(url: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        samples = {s.name: s.value for f in text_string_to_metric_families(r.read().decode()) for s in f.samples}
    n = samples.get("hetero_kv_transfer_seconds_count", 0) or 1
    return {
        "ms": 1000 * samples.get("hetero_kv_transfer_seconds_sum", 0) / n,
        "kib": samples.get("hetero_kv_transfer_bytes_total", 0) / n / 1024,
        "count": n,
    }


def _run(name: str, args: argparse.Namespace, work: Path) -> dict:
    model = [
        "--model",
        str(args.model),
        "--dtype",
        "float32",
        "--block-size",
        "32",
        "--max-model-len",
        str(args.input_len + args.output_len + 32),
    ]
    if name == "single":
        commands = [([*model, "--backend", args.decode_backend], {"OMP_NUM_THREADS": str(args.threads)})]
    else:
        addr = f"127.0.0.1:{free_port()}"
        one = {"OMP_NUM_THREADS": str(args.pd_threads)}
        commands = [
            ([*model, "--backend", args.prefill_backend, "--role", "prefill", "--kv-transfer-addr", addr], one),
            ([*model, "--backend", args.decode_backend, "--role", "decode"], one),
        ]
    with _servers(commands) as urls:
        if name == "single":
            return _measure(urls[0], args, work, name)
        with _pd_router(urls[0], urls[1]) as router:
            summary = _measure(router, args, work, name)
            summary["transfer"] = _transfer(urls[0])
            return summary


def _measure(url: str, args: argparse.Namespace, work: Path, name: str) -> dict:
    _bench(url, args, max(8, args.num_prompts // 4), None)  # warm-up
    return _bench(url, args, args.num_prompts, work / f"{name}.json")


def _table(runs: list[tuple[str, dict]], args: argparse.Namespace) -> str:
    rows = [
        "| config | output tok/s | TTFT p50 / p90 ms | TPOT p50 / p90 ms | KV transfer per request |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for name, s in runs:
        t = s.get("transfer")
        kv = f"{t['kib']:.0f} KiB, sent in {t['ms']:.1f} ms" if t else "-"
        label = (
            f"single ({args.decode_backend}, {args.threads} threads)"
            if name == "single"
            else f"pd ({args.prefill_backend} -> {args.decode_backend}, {args.pd_threads} thread each)"
        )
        rows.append(
            f"| {label} | {s['output_throughput']:.0f} | {s['ttft_ms']['p50']:.0f} / {s['ttft_ms']['p90']:.0f} "
            f"| {s['tpot_ms']['p50']:.1f} / {s['tpot_ms']['p90']:.1f} | {kv} |"
        )
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None)
    p.add_argument("--prefill-backend", default="torch")
    p.add_argument("--decode-backend", default="torch")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--max-concurrency", type=int, default=8)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--pd-threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--markdown", type=Path, default=None)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.model is None:
            from vllm_route import write_models

            args.model = write_models(work, ("qwen3",))["qwen3"]
        runs = [(name, _run(name, args, work)) for _ in range(args.rounds) for name in ("single", "pd")]
    text = _table(runs, args)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
