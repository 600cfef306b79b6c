"""Run by torchrun with 4 processes: prefill logits under tensor parallelism of 4 and of 2, in one launch.

    torchrun --nproc-per-node 4 _logits_worker.py jobs.json OUT_DIR

Each job is {"name", "model", "tp", "prompts"}. A TP=4 job runs on all four
ranks; the TP=2 jobs run on the pairs (0, 1) and (2, 3), alternately, each pair
its own process group. The group's rank 0 writes OUT_DIR/<name>.pt: the logits of
every prompt (float32 [n, vocab], from ``hetero.engine.forward.prefill``) and what
the model looked like on that rank (tp, local and total KV heads, o_proj bias).
"""

from __future__ import annotations

import json
import os
import sys


def main(jobs_path: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    import hetero
    from hetero.distributed import TorchCommunicator, init
    from hetero.engine.forward import build_model, prefill
    from hetero.engine.parallel import Parallel

    world = init("cpu_ref")
    ops = hetero.load("cpu_ref")
    rank = world.rank
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates every group, in the same order
    pair = TorchCommunicator(pairs[rank // 2])

    jobs = json.loads(open(jobs_path).read())
    tp2 = [j["name"] for j in jobs if j["tp"] == 2]
    for job in jobs:
        if job["tp"] == 4:
            comm = world
        elif job["tp"] == 2 and tp2.index(job["name"]) % 2 == rank // 2:
            comm = pair
        else:
            continue
        model = build_model(job["model"], ops, torch.float32, Parallel(comm))
        logits = prefill(model, job["prompts"]).logits
        attn = model.model.layers[0].self_attn
        if comm.rank == 0:
            torch.save(
                {
                    "logits": logits,
                    "tp": comm.world_size,
                    "local_kv_heads": attn.num_kv_heads,
                    "kv_heads": attn.qkv_proj.total_kv_heads,
                    "o_proj_bias": attn.o_proj.bias is not None,
                },
                os.path.join(out_dir, f"{job['name']}.pt"),
            )
    # leave together: a rank that exits while its peer still holds the gloo group can abort the peer
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
