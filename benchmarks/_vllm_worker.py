"""vllm_route.py's ``--worker``: one stock or hetero-routed vLLM engine in this process, timing the workloads.

Run by vllm_route.py and engine_vs_vllm.py (through ``vllm_route.worker_command``) with a Python that has vLLM.
"""

from __future__ import annotations

import json
import os
import time

import vllm_route
from _engine_workers import checkpoint_dtype, new_result, record, top_ids

__all__ = ["worker"]


def worker(model: str, out: str, compiled: bool, requests: int, seed: int, inner: int, top5: int = 0) -> None:
    """One engine in this process: start, warm up, time ``inner`` workloads (seeds seed, seed+1, ...), write JSON:
    per request its tokens, TTFT and TPOT (vLLM's request stats). In the checkpoint's dtype. ``top5``: then the first
    workload's first ``top5`` requests again, untimed, with each position's 5 most likely ids."""
    import torch
    from vllm import LLM, SamplingParams

    start = time.perf_counter()
    llm = LLM(
        model=model,
        skip_tokenizer_init=True,
        dtype=checkpoint_dtype(model),  # "auto" would run a float32 checkpoint in bf16 here
        enforce_eager=not compiled,
        seed=0,
        disable_log_stats=False,  # the request stats that give TTFT and TPOT (on, as in `vllm serve`)
        **vllm_route._ENGINE,
    )
    result = new_result(time.perf_counter() - start, torch.get_num_threads())
    vocab = llm.llm_engine.model_config.get_vocab_size()
    warm, _ = vllm_route.workload(2, vocab, seed + 1000)
    start = time.perf_counter()
    llm.generate([{"prompt_token_ids": p} for p in warm], SamplingParams(max_tokens=8), use_tqdm=False)
    result["warmup_s"] = time.perf_counter() - start
    for i in range(inner):
        prompts, out_lens = vllm_route.workload(requests, vocab, seed + i)
        params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in out_lens]
        start = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        latencies = [_latency(o) for o in outs if o.metrics is not None]
        record(result, time.perf_counter() - start, [list(o.outputs[0].token_ids) for o in outs], latencies)
    if top5:
        prompts, out_lens = vllm_route.workload(requests, vocab, seed)
        params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True, logprobs=5) for m in out_lens[:top5]]
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts[:top5]], params, use_tqdm=False)
        result["top5"] = [[top_ids(pos) for pos in o.outputs[0].logprobs] for o in outs]
    result["routed"] = _routed()
    with open(out, "w") as f:
        json.dump(result, f)


def _latency(out) -> tuple[float, float]:
    """(TTFT, TPOT) of one request from vLLM's request stats."""
    m, n = out.metrics, len(out.outputs[0].token_ids)
    return m.first_token_latency, (m.last_token_ts - m.first_token_ts) / max(1, n - 1)


def _routed() -> dict[str, int] | None:
    """{vLLM class: hetero calls} in this process, or None when hetero-vllm did not route."""
    if os.environ.get("HETERO_VLLM") != "1":
        return None
    from hetero_vllm import report

    return {cls: sum(ops.values()) for cls, ops in report.snapshot()["routed"].items()}
