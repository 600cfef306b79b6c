"""Run by torchrun: greedy tokens under pipeline (and tensor) parallelism. Each job is ``LLM(**job["engine"])``
running ``job["rounds"]`` (lists of prompts, one ``generate`` each, so a later round can hit the prefix cache);
rank r writes {"tokens", "logprobs", "weight_bytes", "kv_bytes", "stats"} per job to out.json.r.

    torchrun --nproc-per-node N _pipeline_worker.py jobs.json out.json
"""

from __future__ import annotations

import json
import os
import sys


def resident_bytes(llm) -> tuple[int, int]:
    """(weight bytes, KV and state cache bytes) this rank holds."""
    weights = {id(p): p.numel() * p.element_size() for p in llm.runner.model.parameters()}
    pools = llm.runner.cache
    cache = {id(t): t.numel() * t.element_size() for t in [*pools.paged.values(), *pools.state.values()]}
    return sum(weights.values()), sum(cache.values())


def run(job: dict) -> dict:
    from hetero.engine import LLM, SamplingParams

    llm = LLM(**job["engine"])
    params = SamplingParams(
        temperature=0.0, max_tokens=job["max_tokens"], ignore_eos=True, logprobs=job.get("logprobs")
    )
    tokens, logprobs = [], []
    for prompts in job["rounds"]:
        for out in llm.generate(prompts, params, progress=False):
            tokens.append(list(out.token_ids))
            logprobs.append([sorted(lp) for lp in out.logprobs or []])
    weights, cache = resident_bytes(llm)
    stats = {k: llm.stats[k] for k in ("preemptions", "cached_prompt_tokens")}
    return {"tokens": tokens, "logprobs": logprobs, "weight_bytes": weights, "kv_bytes": cache, "stats": stats}


def main(jobs_path: str, out_path: str) -> None:
    results = [run(job) for job in json.loads(open(jobs_path).read())]
    with open(f"{out_path}.{os.environ['RANK']}", "w") as f:
        json.dump(results, f)
    import torch.distributed as dist

    dist.barrier()  # leave together: a rank that exits while its peer still holds the gloo group can abort the peer
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
