"""hetero-torch's packed CPU weights against F.linear, side by side in one run.

    .venv/bin/python benchmarks/packed_gemm.py [--rows 1,9,33,53,64,560] [--repeats 30]

The engine benchmark's dense shapes (hidden 512: gate_up 512->3072, down 1536->512, qkv 512->256),
eight distinct weights per shape cycled so that, as in a forward, a weight is not in cache when its
turn comes. Each cell is the mean per product; the ratio is F.linear's time over the packed one's
(above 1: packing is faster). The packed product is checked against F.linear at every shape.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

SHAPES = ((3072, 512), (512, 1536), (256, 512))


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
    args = p.parse_args()
    gen = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| N x K | rows | F.linear us | packed us | F.linear / packed |\n| --- | ---: | ---: | ---: | ---: |")
    for n, k in SHAPES:
        weights = [torch.randn(n, k, generator=gen) for _ in range(8)]
        packed = {id(w): torch.ops.mkldnn._reorder_linear_weight(w, 64) for w in weights}
        for m in map(int, args.rows.split(",")):
            x = torch.randn(m, k, generator=gen)
            pointwise = lambda w: torch.ops.mkldnn._linear_pointwise(x, packed[id(w)], None, "none", [], "")  # noqa: E731
            torch.testing.assert_close(pointwise(weights[0]), F.linear(x, weights[0]), rtol=1e-4, atol=1e-3)
            plain, fast = (
                per_product(lambda w: F.linear(x, w), weights, args.repeats),
                per_product(pointwise, weights, args.repeats),
            )
            print(f"| {n} x {k} | {m} | {plain:.0f} | {fast:.0f} | {plain / fast:.2f}x |")


if __name__ == "__main__":
    main()
