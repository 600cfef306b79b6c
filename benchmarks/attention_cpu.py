"""paged_attention on the CPU: hetero-torch's native kernel against its torch-operator path, one process.

    .venv/bin/python benchmarks/attention_cpu.py [--shape qwen3-0.6b] [--dtype bfloat16]

The engine benchmark's attention (benchmarks/vllm_route.py: 4 query / 2 KV heads of 32, block 32),
or ``--shape qwen3-0.6b``'s (16 query / 8 KV heads of 128), in ``--dtype`` (default float32). Cases:
a decode batch of 64 sequences of 16-253 keys on one layer's cache (warm), the same batch over
eight layers' caches in turn (as a step reads them, mostly from memory), and one 2000-token
prefill (the torch path's is torch's fused SDPA, flash attention on the CPU). Each cell is the
median of 30 timed calls (a call of the eight-layer case is all eight layers, reported per layer);
both paths are checked against each other first.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

HQ, HKV, D, BS = 4, 2, 32, 32
SHAPES = {"tiny": (4, 2, 32), "qwen3-0.6b": (16, 8, 128)}
DTYPE = torch.float32


def _layout(query_lens: list[int], seq_lens: list[int], layers: int, gen: torch.Generator):
    from hetero.spec.types import AttentionMeta

    cols = max(-(-s // BS) for s in seq_lens)
    blocks = len(seq_lens) * cols
    caches = [
        (
            torch.randn(blocks, BS, HKV, D, generator=gen).to(DTYPE),
            torch.randn(blocks, BS, HKV, D, generator=gen).to(DTYPE),
        )
        for _ in range(layers)
    ]
    table = torch.randperm(blocks, generator=gen).view(len(seq_lens), cols).int()
    q = torch.randn(sum(query_lens), HQ, D, generator=gen).to(DTYPE)
    return q, caches, AttentionMeta.build(query_lens, seq_lens, table)


def _median_us(fn, per: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(30):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) / per * 1e6)
    return statistics.median(times)


def main() -> int:
    import argparse

    import hetero

    global HQ, HKV, D, DTYPE
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = p.parse_args()
    (HQ, HKV, D), DTYPE = SHAPES[args.shape], getattr(torch, args.dtype)
    from hetero_torch import _attention_native as native

    if not native.applies(torch.empty(1, 1, 1, 1), torch.empty(1, 1, 1, 1)):
        print("the native CPU kernels are not available here")
        return 1
    ops = hetero.load("torch", validate=False)
    gen = torch.Generator().manual_seed(0)
    decode_lens = torch.randint(16, 254, (64,), generator=gen).tolist()
    cases = {
        "decode, 64 sequences, 1 layer": ([1] * 64, decode_lens, 1),
        "decode, 64 sequences, 8 layers in turn": ([1] * 64, decode_lens, 8),
        "prefill, 2000 tokens": ([2000], [2000], 1),
    }
    print("command:", " ".join([Path(sys.executable).name, *sys.argv]))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {HQ}/{HKV} heads of {D}, {args.dtype}")
    print("| case | native us per layer | torch ops us per layer | torch / native |")
    print("| --- | ---: | ---: | ---: |")
    applies = native.applies
    for name, (query_lens, seq_lens, layers) in cases.items():
        q, caches, meta = _layout(query_lens, seq_lens, layers, gen)

        def call():
            return [ops.paged_attention(q, k, v, meta, scale=D**-0.5) for k, v in caches]

        times = []
        results = []
        for path in (applies, lambda *a, **k: False):  # the second declines, so the torch operators run
            native.applies = path
            results.append(call()[0])
            times.append(_median_us(call, layers))
        native.applies = applies
        tol = 1e-5 if DTYPE == torch.float32 else 2e-2
        torch.testing.assert_close(results[0], results[1], atol=tol, rtol=tol)
        print(f"| {name} | {times[0]:.0f} | {times[1]:.0f} | {times[1] / times[0]:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
