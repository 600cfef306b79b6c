"""Run by torchrun: greedy tokens under tensor / expert parallelism; each rank writes them as JSON
(rank 0 to out.json, rank r to out.json.r). A job with "stray" adds one more request on rank 1 only:
rank 0 owns the requests, so it must change nothing. A job with "spec" runs speculative decoding.

    torchrun --nproc-per-node 2 _parallel_worker.py jobs.json out.json
"""

from __future__ import annotations

import json
import os
import sys


def main(jobs_path: str, out_path: str) -> None:
    from hetero.engine import LLM, SamplingParams

    results = []
    for job in json.loads(open(jobs_path).read()):
        llm = LLM(
            job["model"],
            backend=job["backend"],
            dtype="float32",
            tensor_parallel_size=job["tp"],
            expert_parallel=job["ep"],
            max_num_seqs=16,
            block_size=8,
            speculative_config=job.get("spec"),
        )
        params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], ignore_eos=True)
        if job.get("stray") and llm.rank == 1:
            llm.add_request([5, 6, 7], params, request_id="stray")
        results.append([list(o.token_ids) for o in llm.generate(job["prompts"], params, progress=False)])
    rank = int(os.environ["RANK"])
    with open(out_path if rank == 0 else f"{out_path}.{rank}", "w") as f:
        json.dump(results, f)
    # leave together: a rank that exits while its peer still holds the gloo group can abort the peer
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
