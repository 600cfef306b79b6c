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
    if job.get("abort_after"):  # step by step; rank 0 aborts the first request after that many steps
        return aborting(llm, job, params)
    for prompts in job["rounds"]:
        for out in llm.generate(prompts, params, progress=False):
            tokens.append(list(out.token_ids))
            logprobs.append([sorted(lp) for lp in out.logprobs or []])
    weights, cache = resident_bytes(llm)
    stats = {k: llm.stats[k] for k in ("preemptions", "cached_prompt_tokens")}
    return {"tokens": tokens, "logprobs": logprobs, "weight_bytes": weights, "kv_bytes": cache, "stats": stats}


def aborting(llm, job: dict, params) -> dict:
    """The other requests' tokens (rank 0), whether the first was aborted unfinished and never reported as
    finished after, and the blocks still in use."""
    ids = [llm.add_request(p, params) for p in job["rounds"][0]]
    done, steps, aborted = {}, 0, False
    while llm.has_unfinished():
        done.update((o.request_id, o) for o in llm.step() if o.finished)
        steps += 1
        if steps == job["abort_after"] and llm.rank == 0:
            aborted = llm.abort(ids[0]) and ids[0] not in done
    tokens = [list(done[i].token_ids) for i in ids[1:]] if llm.rank == 0 else []
    aborted = aborted and ids[0] not in done
    return {"tokens": tokens, "aborted": aborted, "blocks_in_use": llm.block_manager.num_used_blocks}


def main(jobs_path: str, out_path: str) -> None:
    results = [run(job) for job in json.loads(open(jobs_path).read())]
    with open(f"{out_path}.{os.environ['RANK']}", "w") as f:
        json.dump(results, f)
    import torch.distributed as dist

    dist.barrier()  # leave together: a rank that exits while its peer still holds the gloo group can abort the peer
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
