"""Speculative decoding's throughput and acceptance beside plain decoding, per method, in one process.

    .venv/bin/python benchmarks/spec_decode.py [--models qwen3,qwen3-0.6b] [--batches 1,8] [--output-len 64]
        [--repeats 2] [--k 3] [--markdown F] [--json F]

Targets: engine_vs_vllm.py's checkpoints (``_workloads.MODELS``: a tiny float32 Qwen3 and Qwen3-0.6B's
shape in bfloat16, random weights), plus a tiny DeepSeek-V3 with a random MTP layer. The workload repeats
each prompt's opening (a random chunk, then the chunk again and a random tail), so n-gram lookup finds
matches in the prompt and in what greedy decoding of random weights tends to repeat. Requests run
greedy, EOS ignored, all at once, in batches of each ``--batches`` size (the first b prompts). Per
target, every config runs in this process with repeats
interleaved: plain decoding, "ngram" (prompt lookup 1-3), "draft_model" with the target itself as its
draft (the mechanical upper bound: every draft accepted, at the price of running the model twice),
and where the target has them "mtp" and "eagle3" with random weights (drafts almost never accepted:
the cost of speculation that buys nothing). Each row: output tok/s (best and median of the repeats),
its ratio to plain decoding's (medians), the mean acceptance length (tokens per verification) and the
acceptance rate, and how many requests' tokens equal plain decoding's (all of them in float32; in
bfloat16 a verify row goes through the prefill path, which may round differently).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def _prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        chunk = rng.integers(3, vocab, 12).tolist()
        out.append(chunk + rng.integers(3, vocab, 4).tolist() + chunk + rng.integers(3, vocab, 6).tolist())
    return out


def _configs(name: str, path: Path, k: int, extra: dict) -> list[tuple[str, dict | None]]:
    configs = [("plain", None), ("ngram", {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3})]
    configs.append(("draft_model=self", {"method": "draft_model", "model": str(path), "num_speculative_tokens": k}))
    if extra.get("mtp"):
        configs.append(("mtp (random)", {"method": "mtp", "num_speculative_tokens": k}))
    if extra.get("eagle3"):
        configs.append(("eagle3 (random)", {"method": "eagle3", "model": extra["eagle3"], "num_speculative_tokens": k}))
    return configs


def _targets(root: Path, names: list[str]) -> dict[str, tuple[Path, str, dict]]:
    """name -> (checkpoint, dtype, extras: an EAGLE-3 head for Qwen3 targets, an MTP layer)."""
    import _workloads

    from hetero.tools import tiny
    from hetero.tools.tiny import add_mtp, write_eagle3

    out = {}
    for name, path in _workloads.write(root, names).items():
        extra = {}
        if _workloads.MODELS[name].arch == "qwen3":
            extra["eagle3"] = str(write_eagle3(path, root / f"{name}-eagle3"))
        out[name] = (path, _workloads.MODELS[name].dtype, extra)
    ds = tiny.build("deepseek_v3", root / "deepseek_v3-mtp", tokenizer=False)
    out["deepseek_v3 (tiny, MTP)"] = (add_mtp(ds), "float32", {"mtp": True})
    return out


def _run(llm, ps: list[list[int]], max_tokens: int) -> tuple[float, list[list[int]], dict | None]:
    from hetero.engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    before = llm.stats["spec_decode"].copy() if "spec_decode" in llm.stats else None
    start = time.perf_counter()
    outs = llm.generate(ps, params, progress=False)
    seconds = time.perf_counter() - start
    spec = (llm.stats["spec_decode"] - before).as_dict() if before is not None else None
    return sum(len(o.token_ids) for o in outs) / seconds, [list(o.token_ids) for o in outs], spec


def measure(args) -> list[dict]:
    from hetero.engine import LLM

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (path, dtype, extra) in _targets(Path(tmp), args.models.split(",")).items():
            from transformers import AutoConfig

            vocab = AutoConfig.from_pretrained(path).vocab_size
            batches = [int(b) for b in args.batches.split(",")]
            ps = _prompts(max(batches), vocab, seed=0)
            configs = _configs(name, path, args.k, extra)
            kw = dict(backend=args.backend, dtype=dtype, max_model_len=256, max_num_seqs=max(batches))
            engines = {c: LLM(str(path), speculative_config=spec, **kw) for c, spec in configs}
            for c, _ in configs:  # warm-up
                _run(engines[c], ps[:2], 8)
            for b in batches:
                results: dict[str, list] = {c: [] for c, _ in configs}
                for _ in range(args.repeats):
                    for c, _ in configs:
                        results[c].append(_run(engines[c], ps[:b], args.output_len))
                rows += _rows(name, dtype, b, configs, results)
            del engines
    return rows


def _rows(name: str, dtype: str, batch: int, configs, results: dict[str, list]) -> list[dict]:
    plain = statistics.median(r[0] for r in results["plain"])
    rows = []
    for c, _ in configs:
        rates = [r[0] for r in results[c]]
        spec = results[c][-1][2]
        tokens, want = results[c][0][1], results["plain"][0][1]
        rows.append(
            {
                "target": name,
                "dtype": dtype,
                "batch": batch,
                "config": c,
                "tok_s": max(rates),
                "median_tok_s": statistics.median(rates),
                "x_plain": statistics.median(rates) / plain,
                "acceptance_length": spec["mean_acceptance_length"] if spec else None,
                "acceptance_rate": spec["acceptance_rate"] if spec else None,
                "identical": sum(a == b for a, b in zip(tokens, want)),
                "requests": len(want),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| target | batch | config | output tok/s best (median) | x plain (medians) | acceptance length "
        "| acceptance rate | tokens = plain |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        al = "-" if r["acceptance_length"] is None else f"{r['acceptance_length']:.2f}"
        ar = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.0%}"
        lines.append(
            f"| {r['target']} ({r['dtype']}) | {r['batch']} | {r['config']} | {r['tok_s']:.1f} "
            f"({r['median_tok_s']:.1f}) | {r['x_plain']:.2f}x | {al} | {ar} | {r['identical']}/{r['requests']} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="qwen3,qwen3-0.6b")
    p.add_argument("--backend", default="torch")
    p.add_argument("--batches", default="1,8", help="batch sizes (requests at once), comma-separated")
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    p.add_argument("--markdown", metavar="F")
    p.add_argument("--json", metavar="F")
    args = p.parse_args()
    rows = measure(args)
    text = table(rows)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
