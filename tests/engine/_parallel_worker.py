"""Run by torchrun: greedy tokens under tensor / expert parallelism; rank 0 writes them as JSON.

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
        llm = LLM(job["model"], backend=job["backend"], dtype="float32", tensor_parallel_size=job["tp"],
                  expert_parallel=job["ep"], max_num_seqs=16, block_size=8)
        params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], ignore_eos=True)
        results.append([list(o.token_ids) for o in llm.generate(job["prompts"], params, progress=False)])
    if int(os.environ["RANK"]) == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    # leave together: a rank that exits while its peer still holds the gloo group can abort the peer
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
