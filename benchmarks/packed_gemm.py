"""hetero-torch's packed CPU weights against F.linear, side by side in one run.

    .venv/bin/python benchmarks/packed_gemm.py [--rows 1,9,33,53,64,560] [--repeats 30]
        [--dtype float32|bfloat16] [--shapes tiny|qwen3-0.6b]

The engine benchmark's dense shapes (``tiny``, hidden 512: gate_up 512->3072, down 1536->512, qkv
512->256) or Qwen3-0.6B's (qkv 1024->4096, o 2048->1024, gate_up 1024->6144, down 3072->1024 and the
151936-row LM head), up to eight distinct weights per shape (64 MiB at most) cycled so that, as in a
forward, a weight is not in cache when its turn comes. bfloat16 needs oneDNN's bf16 path. Each cell is
the mean per product; the ratio is F.linear's time over the packed one's
(above 1: packing is faster). The packed product is checked against F.linear at every shape.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

SHAPES = {
    "tiny": ((3072, 512), (512, 1536), (256, 512)),
    "qwen3-0.6b": ((4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072), (151936, 1024)),
}


def per_product(fn, weights: list, repeats: int) -> float:
    """Mean microseconds of one product, over ``repeats`` passes across all weights (after 3 untimed)."""
    for _ in range(3):
        [fn(w) for w in weights]
    start = time.perf_counter()
    for _ in range(repeats):
        [fn(w) for w in weights]
    return (time.perf_counter() - start) / (repeats * len(weights)) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,9,33,53,64,560")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--shapes", choices=tuple(SHAPES), default="tiny")
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    tol = dict(rtol=1e-4, atol=1e-3) if dtype == torch.float32 else dict(rtol=2**-7, atol=1e-2)
    gen = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}")
    print("| N x K | rows | F.linear us | packed us | F.linear / packed |\n| --- | ---: | ---: | ---: | ---: |")
    for n, k in SHAPES[args.shapes]:
        count = max(1, min(8, (64 << 20) // (n * k * dtype.itemsize)))
        weights = [torch.randn(n, k, generator=gen).to(dtype) for _ in range(count)]
        packed = {id(w): torch.ops.mkldnn._reorder_linear_weight(w, 64) for w in weights}
        for m in map(int, args.rows.split(",")):
            x = torch.randn(m, k, generator=gen).to(dtype)
            pointwise = lambda w: torch.ops.mkldnn._linear_pointwise(x, packed[id(w)], None, "none", [], "")  # noqa: E731
            torch.testing.assert_close(pointwise(weights[0]), F.linear(x, weights[0]), **tol)
            plain, fast = (
                per_product(lambda w: F.linear(x, w), weights, args.repeats),
                per_product(pointwise, weights, args.repeats),
            )
            print(f"| {n} x {k} | {m} | {plain:.0f} | {fast:.0f} | {plain / fast:.2f}x |")


if __name__ == "__main__":
    main()
