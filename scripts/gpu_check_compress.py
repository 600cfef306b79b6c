"""The kv_compress cases of scripts/gpu_check.py (spec 1.8) at DeepSeek-V4's compressors: CSA (m 4 with
overlap, D 512), HCA (m 128, D 512) and the CSA indexer's (m 4 with overlap, D 128), rope on 64 dims.

- decode: B sequences of one row each, every one closing a window (start = k*m - 1), deep in a context
  of about L tokens: the worst decode step, each entry's other 2m-1 (CSA) or m-1 (HCA) rows from the ring.
- prefill: chunked-prefill chunks (sequences x tokens each) continuing at an unaligned start, so the
  first window of each chunk reaches back into the ring.

Bytes and flops are ``hetero.bench.model``'s (``hetero.bench._compress_work``): this call's kv and gate
rows once, the ring half-rows the closing windows read, the ring rows written, one entry of D per window;
about 6 flops per (slot, channel) of each window.
"""

from __future__ import annotations

import torch
from gpu_check_sizes import Bench, Sizes

from hetero.bench.model import work
from hetero.verify.inputs import compress as draw
from hetero.verify.oracles import to_device

__all__ = ["compress_benches"]

D, D_INDEX, ROT, CSA, HCA = 512, 128, 64, 4, 128


def _bench(name: str, d: int, m: int, overlap: bool, seqs: list[tuple[int, int]]) -> Bench:
    def make(dev):
        build = draw.kv_compress(d, m, overlap, seqs, bsc=64 if m == CSA else 2, rot=ROT)
        inputs = to_device(build(torch.Generator().manual_seed(0), torch.bfloat16), torch.device(dev))
        cost = work("kv_compress", inputs)
        return inputs, cost.flops, cost.bytes

    return Bench("kv_compress", name, "bfloat16", make)


def compress_benches(s: Sizes) -> list[Bench]:
    """Decode at the decode batch, prefill at the prefill chunks, for each of the three compressors (smoke: two)."""
    (b, length), (sp, tp) = s.decode, s.prefill
    out = []
    for label, d, m, overlap in (("csa", D, CSA, True), ("hca", D, HCA, False), ("indexer", D_INDEX, CSA, True)):
        start = max(1, length // m) * m - 1
        decode = [(1, start + m * (i % 3)) for i in range(b)]
        prefill = [(tp, length + 2 + i) for i in range(sp)]
        out += [
            _bench(f"deepseek-v4 {label} m{m} D{d} decode B{b} L{length}", d, m, overlap, decode),
            _bench(
                f"deepseek-v4 {label} m{m} D{d} chunked-prefill {sp}x{tp} from {length + 2}", d, m, overlap, prefill
            ),
        ]
    if length < 1024:  # smoke: the CSA decode and the HCA prefill cover both kernels' paths on a CPU
        out = [out[0], out[3]]
    return out
