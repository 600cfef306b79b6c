"""engine_vs_vllm.py's engine processes: hetero's LLM and transformers' generate, each timing the workloads.

A worker starts its engine (``init_s``), warms it up untimed on batches of 4 down to 1 (``warmup_s``: a compiled
config builds its graphs here), times ``inner`` workloads and writes per request its tokens, its TTFT and TPOT
(seconds; hetero only, from ``RequestOutput.metrics``). With ``top5`` it then reruns the first workload's first
requests untimed with 5 logprobs, each generated position's top-5 ids: the reference for bf16 agreement.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import vllm_route

__all__ = [
    "TOP5_REQUESTS",
    "hetero_worker",
    "hf_worker",
    "workload",
    "new_result",
    "record",
    "top_ids",
    "checkpoint_dtype",
]

#: requests whose top-5 the reference records (the agreement check's sample)
TOP5_REQUESTS = 16


def workload(requests: int, vocab: int, seed: int, max_tokens: int | None) -> tuple[list[list[int]], list[int]]:
    """vllm_route's workload, output lengths capped at ``max_tokens`` when given (hetero and hf workers only)."""
    prompts, out_lens = vllm_route.workload(requests, vocab, seed)
    return prompts, [min(m, max_tokens or m) for m in out_lens]


def checkpoint_dtype(model: str) -> str:
    """The dtype config.json names ("float32", "bfloat16", ...): every engine is given it explicitly,
    since vLLM's ``dtype="auto"`` runs a float32 checkpoint in bfloat16 on CPUs that have bf16."""
    with open(os.path.join(model, "config.json")) as f:
        config = json.load(f)
    return str(config.get("dtype") or config["torch_dtype"])


def new_result(init_s: float, threads: int) -> dict[str, Any]:
    return {
        "init_s": init_s,
        "torch_threads": threads,
        "seconds": [],
        "rates": [],
        "tokens": [],
        "load": [],
        "ttft": [],
        "tpot": [],
    }


def record(result: dict, seconds: float, tokens: list[list[int]], latencies: list[tuple[float, float]] = ()) -> None:
    result["seconds"].append(seconds)
    result["rates"].append(sum(map(len, tokens)) / seconds)
    result["load"].append(os.getloadavg()[0])
    result["tokens"] += tokens
    for ttft, tpot in latencies:
        result["ttft"].append(ttft)
        result["tpot"].append(tpot)


def _latency(out) -> tuple[float, float]:
    m, n = out.metrics, len(out.token_ids)
    first = m["first_token_time"] - m["arrival_time"]
    return first, (m["finish_time"] - m["first_token_time"]) / max(1, n - 1)


def hetero_worker(
    backend: str,
    compiled: bool,
    model: str,
    device: str,
    requests: int,
    seed: int,
    inner: int,
    max_tokens: int | None = None,
    top5: bool = False,
) -> dict:
    """Start ``hetero.engine.LLM`` on ``backend`` in the checkpoint's dtype, warm up, time ``inner`` workloads."""
    import torch

    from hetero.engine import LLM, SamplingParams

    extra = {"compile": True} if compiled else {}
    start = time.perf_counter()
    try:
        llm = LLM(model, backend=backend, dtype=checkpoint_dtype(model), device=device, **vllm_route._ENGINE, **extra)
    except Exception as e:  # noqa: BLE001  (a config this machine or this hetero cannot start is reported, not fatal)
        return {"unavailable": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
    result = new_result(time.perf_counter() - start, torch.get_num_threads())
    report = getattr(llm.runner.forward, "report", None)
    if report:  # compiled at start-up (part of init_s): its seconds, and whether the compile cache served it
        result["compile"] = {k: report[k] for k in ("compile_s", "graphs", "cache_hits")}
    vocab = llm.config.hf_config.vocab_size
    # batches of 4 down to 1 over several lengths: a compiled config built its graphs at start-up; this checks
    warm, _ = vllm_route.workload(4, vocab, seed + 1000)
    start = time.perf_counter()
    llm.generate(warm, [SamplingParams(max_tokens=8 * (i + 1)) for i in range(4)], progress=False)
    result["warmup_s"] = time.perf_counter() - start
    for i in range(inner):
        prompts, out_lens = workload(requests, vocab, seed + i, max_tokens)
        params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in out_lens]
        start = time.perf_counter()
        outs = llm.generate(prompts, params, progress=False)
        record(result, time.perf_counter() - start, [list(o.token_ids) for o in outs], [_latency(o) for o in outs])
    if top5:
        prompts, out_lens = workload(requests, vocab, seed, max_tokens)
        params = [
            SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True, logprobs=5) for m in out_lens[:TOP5_REQUESTS]
        ]
        outs = llm.generate(prompts[:TOP5_REQUESTS], params, progress=False)
        result["top5"] = [[top_ids(entry) for entry in o.logprobs] for o in outs]
    return result


def top_ids(entry: dict) -> list[int]:
    """The 5 most likely ids of one position's logprobs ({id: Logprob}, hetero's or vLLM's)."""
    return sorted(entry, key=lambda t: -entry[t].logprob)[:5]


def hf_worker(
    model: str, device: str, requests: int, seed: int, inner: int, max_tokens: int | None = None, top5: bool = False
) -> dict:
    """transformers ``generate`` on one left-padded batch per workload; each request's own tokens count."""
    import torch
    import transformers

    from hetero.tools.check import greedy_generation_config

    start = time.perf_counter()
    hf = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=checkpoint_dtype(model)).to(device).eval()
    result = new_result(time.perf_counter() - start, torch.get_num_threads())
    with torch.inference_mode():
        warm, _ = vllm_route.workload(2, hf.config.vocab_size, seed + 1000)
        start = time.perf_counter()
        _hf_batch(hf, warm, [8, 8], device, greedy_generation_config)
        result["warmup_s"] = time.perf_counter() - start
        for i in range(inner):
            prompts, out_lens = workload(requests, hf.config.vocab_size, seed + i, max_tokens)
            start = time.perf_counter()
            tokens = _hf_batch(hf, prompts, out_lens, device, greedy_generation_config)
            record(result, time.perf_counter() - start, tokens)
    return result


def _hf_batch(hf, prompts: list[list[int]], out_lens: list[int], device: str, generation_config) -> list[list[int]]:
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    out = hf.generate(ids, attention_mask=mask, generation_config=generation_config(hf, max(out_lens))).tolist()
    return [row[width : width + m] for row, m in zip(out, out_lens)]
