"""Run by torchrun (2 ranks, tensor parallel): moves caches in and out of TP=2 engines, for test_pd_tp.py.

    torchrun --nproc-per-node 2 _pd_tp_worker.py JOBS.json

Each job names a ``model``, ``prompts``, and three files: ``import`` (caches a TP=1 engine exported, run here
from each imported cache, cut into the ranks' shards; greedy tokens and the tokens computed written to
``tokens``) and ``export`` (every prompt but its last token computed here, its cache exported, gathered on
rank 0, and saved with this engine's KV link identity).
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

from hetero.engine import LLM, SamplingParams
from hetero.serve.pd.identity import Identity

MAX_TOKENS = 8


def _import(llm: LLM, rank: int, job: dict) -> None:
    saved = torch.load(job["import"], weights_only=False)
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    for i, (p, cache) in enumerate(zip(job["prompts"], saved)):
        llm.add_request(p, greedy, f"i{i}", cache=cache)
    done = {}
    while llm.has_unfinished():
        done.update((o.request_id, list(o.token_ids)) for o in llm.step() if o.finished)
    if rank == 0:
        tokens = [done[f"i{i}"] for i in range(len(job["prompts"]))]
        with open(job["tokens"], "w") as f:
            json.dump({"tokens": tokens, "computed": sum(llm.stats["step_tokens"])}, f)


def _export(llm: LLM, rank: int, job: dict) -> None:
    prompts = job["prompts"]
    for i, p in enumerate(prompts):  # every rank adds (rank 0's requests are the ones that run)
        llm.add_request(p[:-1], SamplingParams(temperature=0.0, max_tokens=2), f"e{i}")
    caches = {}
    while len(caches) < len(prompts):  # each exported once its prompt is computed, then ended (as a server does)
        for o in llm.step():  # every rank sees rank 0's outputs
            caches[o.request_id] = llm.export_cache(o.request_id if rank == 0 else None)
            llm.abort(o.request_id)
    if rank == 0:
        ordered = [caches[f"e{i}"] for i in range(len(prompts))]
        torch.save({"caches": ordered, "identity": Identity.of(llm, "prefill")}, job["export"])


def main(jobs: str) -> None:
    rank = int(os.environ["RANK"])
    for job in json.loads(open(jobs).read()):
        llm = LLM(job["model"], backend="cpu_ref", dtype="float32", tensor_parallel_size=2, block_size=8)
        _import(llm, rank, job)
        _export(llm, rank, job)
    dist.barrier()  # leave together: a rank that exits while its peer still holds the gloo group can abort it


if __name__ == "__main__":
    main(sys.argv[1])
