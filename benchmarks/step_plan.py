"""Host time of one step's attention calls with and without the step plan (spec 1.6), one process.

    .venv/bin/python benchmarks/step_plan.py [--layers 28] [--repeats 30]

Qwen3-0.6B's attention (16 query / 8 KV heads of 128, block 16) over ``--layers`` layers' caches,
float32, through ``hetero.load("torch")`` with its default validation (on for CPU tensors): a
decode batch of 16 sequences of 20-200 keys, and a mixed batch (the decodes plus a 64-token
prefill chunk). "unplanned" calls every layer with the bare metadata (the registry checks it and
the backend prepares it per call); "planned" makes the plan once (``Ops.plan_attention``, its time
included) and passes it to every layer. Each cell is the median of ``--repeats`` steps, in
microseconds per step; both paths are checked against each other first. The torch-operator path
(``HETERO_TORCH_NATIVE=0``) is the one that groups the batch on the host.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

HQ, HKV, D, BS = 16, 8, 128, 16


def _case(query_lens: list[int], seq_lens: list[int], layers: int, gen: torch.Generator):
    from hetero.spec.types import AttentionMeta

    cols = max(-(-s // BS) for s in seq_lens)
    blocks = len(seq_lens) * cols
    caches = [(torch.randn(blocks, BS, HKV, D, generator=gen),) * 2 for _ in range(layers)]
    table = torch.randperm(blocks, generator=gen).view(len(seq_lens), cols).int()
    return torch.randn(sum(query_lens), HQ, D, generator=gen), caches, AttentionMeta.build(query_lens, seq_lens, table)


def main() -> None:
    import hetero

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--repeats", type=int, default=30)
    args = p.parse_args()
    ops, gen = hetero.load("torch"), torch.Generator().manual_seed(0)
    decodes = torch.randint(20, 200, (16,), generator=gen).tolist()
    batches = {"decode 16": ([1] * 16, decodes), "decode 16 + prefill 64": ([1] * 16 + [64], decodes + [64])}
    print(f"torch backend, validate={ops.validate}, {args.layers} layers, µs per step (median of {args.repeats})")
    print(f"{'batch':<24} {'unplanned':>10} {'planned':>10} {'saved':>8}")
    for name, (qlens, slens) in batches.items():
        q, caches, meta = _case(qlens, slens, args.layers, gen)
        nb = caches[0][0].shape[0]

        def step(planned: bool) -> torch.Tensor:
            m = ops.plan_attention(meta, num_tokens=q.shape[0], num_blocks=nb, block_size=BS) if planned else meta
            for k, v in caches:
                out = ops.paged_attention(q, k, v, m, scale=D**-0.5)
            return out

        torch.testing.assert_close(step(True), step(False), rtol=0, atol=0)
        times = {}
        for planned in (False, True, False, True):  # interleaved, the second pair timed
            samples = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                step(planned)
                samples.append(time.perf_counter() - t0)
            times[planned] = statistics.median(samples) * 1e6
        print(f"{name:<24} {times[False]:>10.0f} {times[True]:>10.0f} {times[False] - times[True]:>8.0f}")


if __name__ == "__main__":
    main()
