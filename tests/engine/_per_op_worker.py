"""Run by torchrun: ``per_op_check`` under tensor parallelism; rank r writes its report's JSON to out.json.r.

torchrun --nproc-per-node 2 _per_op_worker.py MODEL BACKEND out.json
"""

from __future__ import annotations

import json
import os
import sys


def main(model: str, backend: str, out_path: str) -> None:
    from hetero.tools.replay import per_op_check

    report = per_op_check(
        model, backend, [list(range(3, 40)), [5, 6, 7]], max_tokens=3, samples=2, tensor_parallel_size=2
    )
    with open(f"{out_path}.{os.environ['RANK']}", "w") as f:
        json.dump(report.as_dict(), f)
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
