"""engine_vs_vllm.py's report: the rows of one run per model and config, their Markdown tables and verdicts."""

from __future__ import annotations

import statistics
from dataclasses import asdict
from typing import Any

__all__ = ["REFERENCES", "model_rows", "table", "verdict", "report"]

#: the configs whose tokens the others are compared with, the first that ran
REFERENCES = ("vllm-eager", "hetero-cpu_ref")


def agreement(tokens: list[list[int]], ref_tokens: list[list[int]], ref_top5: list[list[list[int]]]) -> dict:
    """Over the requests the reference has top-5 ids for: how many have the reference's first token, and how many
    keep the top-5 rule (identical up to the first differing token, which is among the reference's 5 most likely)."""
    first = top5 = 0
    for got, want, top in zip(tokens, ref_tokens, ref_top5):
        first += bool(got) and bool(want) and got[0] == want[0]
        split = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        top5 += split is None or (split < len(top) and got[split] in top[split])
    return {"first_token": first, "top5": top5, "sampled": len(ref_top5)}


def model_rows(model: str, configs: list[Any], runs: dict[str, list[dict]], roofline: dict | None = None) -> list[dict]:
    """One row per config (dataclass with ``name``) of ``model``: status, best and median tok/s, median TTFT and
    TPOT, start and warm-up seconds, token identity with the reference (and the bf16 agreement where the reference
    recorded top-5 ids), the fraction of ``roofline`` (decode_roofline's) and the ratios over vLLM eager and
    compiled where they ran."""
    ok = {name: rs for name, rs in runs.items() if "seconds" in rs[0]}
    reference = next((r for r in REFERENCES if r in ok), next(iter(ok), None))
    rows = []
    for c in configs:
        rs = runs[c.name]
        row = {
            "model": model,
            **asdict(c),
            "status": "ok" if c.name in ok else "unavailable" if "unavailable" in rs[0] else "FAILED",
        }
        if c.name not in ok:
            row["reason"] = rs[0].get("unavailable") or rs[0].get("failed")
        else:
            rates = [t for r in rs for t in r["rates"]]
            ref_tokens = ok[reference][0]["tokens"]
            row.update(
                tok_s=max(rates),
                median_tok_s=statistics.median(rates),
                timed=len(rates),
                seconds=[round(t, 3) for r in rs for t in r["seconds"]],
                init_s=[round(r["init_s"], 1) for r in rs],
                load=max(x for r in rs for x in r["load"]),
                torch_threads=rs[0]["torch_threads"],
                reference=reference,
                requests=len(ref_tokens),
                identical=sum(a == b for a, b in zip(rs[0]["tokens"], ref_tokens)),
                runs_identical=all(r["tokens"] == rs[0]["tokens"] for r in rs),
                warmup_s=[round(r.get("warmup_s", 0.0), 1) for r in rs],
            )
            if "compile" in rs[0]:
                row["compile"] = [r["compile"] for r in rs]
            latencies = {k: [x for r in rs for x in r.get(k, [])] for k in ("ttft", "tpot")}
            row.update({k: statistics.median(v) for k, v in latencies.items() if v})
            if "top5" in ok[reference][0]:
                row["agreement"] = agreement(rs[0]["tokens"], ref_tokens, ok[reference][0]["top5"])
            if roofline:
                row["roofline_tok_s"] = roofline["tok_s"]
                row["roofline_fraction"] = row["tok_s"] / roofline["tok_s"]
        rows.append(row)
    for row in rows:
        for vllm in ("vllm-eager", "vllm-compiled"):
            base = next((r for r in rows if r["name"] == vllm and r["status"] == "ok"), None)
            if base and row["status"] == "ok":
                row[f"x_{vllm}"] = row["tok_s"] / base["tok_s"]
                row[f"median_x_{vllm}"] = row["median_tok_s"] / base["median_tok_s"]
    return rows


def table(rows: list[dict], model: str) -> str:
    """One model's rows as Markdown: tok/s best (median), that rate over vLLM's (>1: faster), median TTFT and
    TPOT, agreement with the reference, the decode roofline fraction where known, start seconds (with a compiled
    hetero config's start-up compile: seconds, graphs, graphs the compile cache served) and warm-up seconds."""
    lines = [
        "| config | output tok/s best (median) | x vLLM eager (medians) | x vLLM compiled (medians) "
        "| TTFT / TPOT ms (median) | identical requests | first token / top-5 | decode roofline | start s "
        "| warm-up s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in (r for r in rows if r["model"] == model):
        if r["status"] != "ok":
            lines.append(f"| {r['name']} | {r['status']}: {r['reason'].replace('|', '/')} | | | | | | | | |")
            continue
        ratios = [
            f"{r[f'x_{v}']:.2f}x ({r[f'median_x_{v}']:.2f}x)" if f"x_{v}" in r else "-"
            for v in ("vllm-eager", "vllm-compiled")
        ]
        reference = r["name"] == r["reference"]
        same = f"{r['identical']}/{r['requests']}" + (" (reference)" if reference else "")
        latency = f"{r['ttft'] * 1e3:.0f} / {r['tpot'] * 1e3:.1f}" if "tpot" in r else "-"
        agree = r.get("agreement")
        agree = f"{agree['first_token']}/{agree['sampled']} / {agree['top5']}/{agree['sampled']}" if agree else "-"
        roof = f"{r['roofline_fraction']:.1%} of {_rate(r['roofline_tok_s'])}" if "roofline_fraction" in r else "-"
        start = f"{max(r['init_s']):.1f}"
        if r.get("compile"):
            c = max(r["compile"], key=lambda c: c["compile_s"])
            start += f" (compile {c['compile_s']:.1f}: {c['graphs']} graphs, {c['cache_hits']} cached)"
        lines.append(
            f"| {r['name']} | {_rate(r['tok_s'])} ({_rate(r['median_tok_s'])}) | {ratios[0]} | {ratios[1]} "
            f"| {latency} | {same} | {agree} | {roof} | {start} | {max(r['warmup_s'], default=0):.1f} |"
        )
    return "\n".join(lines)


def _rate(tok_s: float) -> str:
    return f"{tok_s:.0f}" if tok_s >= 100 else f"{tok_s:.1f}"


def verdict(rows: list[dict], model: str) -> str:
    """The fastest hetero config against vLLM eager and compiled, with its token identity."""
    hetero = [r for r in rows if r["model"] == model and r["engine"] == "hetero" and r["status"] == "ok"]
    if not hetero:
        return f"{model}: no hetero config ran"
    best = max(hetero, key=lambda r: r["tok_s"])
    ratios = ", ".join(f"{r[f'x_{v}']:.2f}x {v}" for v in ("vllm-eager", "vllm-compiled") if f"x_{v}" in (r := best))
    return (
        f"{model}: fastest hetero config {best['name']} {_rate(best['tok_s'])} tok/s = "
        f"{ratios or 'no vLLM to compare'}; tokens identical to {best['reference']} "
        f"on {best['identical']}/{best['requests']} requests"
    )


def report(rows: list[dict], models: list[str], args) -> str:
    """The Markdown result: how it was measured, then each model's table and verdict."""
    parts = [
        f"{args.requests} requests; best of {args.repeats} interleaved processes x {args.inner} timed workloads "
        f"(medians beside); x vLLM = this config's tok/s / vLLM's (above 1: faster); tokens compared per request "
        f"(bfloat16: first token and the top-5 rule on the reference's first requests); decode roofline = output "
        f"tok/s over the fastest the machine's ceilings allow a decode step of the batch; warm-up includes compiling; "
        f"hetero runs with HETERO_VALIDATE=0."
    ]
    for model in models:
        parts += [f"### {model}", table(rows, model), verdict(rows, model)]
    return "\n\n".join(parts)
