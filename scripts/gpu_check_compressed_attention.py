"""The compressed_attention cases of scripts/gpu_check.py (spec 1.8): DeepSeek-V4's attention of H query heads
over a window of 128 raw rows of one K=V head of 512 plus the compressed entries, with per-head sinks.

- decode: B sequences of one row each at about L tokens; HCA (m 128: L // 128 entries each) and CSA (m 4,
  the top 512 of L // 4), V4-Flash's 64 heads, and V4-Pro's 128 for CSA.
- chunked prefill: sequences x tokens each after L tokens, HCA and CSA.

Smoke sizes shrink the model (4 heads of 64, a window of 8, HCA m 8) so the reference runs them on a CPU.
Bytes and flops are ``hetero.bench.model``'s (``hetero.bench._compressed_attention``): the query, the raw
rows and entries some row reads once, the output; 4 D flops per (row, key, head).
"""

from __future__ import annotations

import torch
from gpu_check_sizes import Bench, Sizes

from hetero.bench.model import work
from hetero.verify.inputs import compressed_attention as draw
from hetero.verify.oracles import to_device

__all__ = ["compressed_attention_benches"]


def _bench(name: str, m: draw.V4Attention, ratio: int, seqs: list[tuple[int, int]], topk: int) -> Bench:
    def make(dev):
        if torch.device(dev).type == "meta":  # the draw fills real block tables and entries: listing shows "-"
            raise ValueError("compressed_attention's inputs need real block tables")
        build = draw.compressed_attention(
            m, ratio, seqs, bs=64, bsc=64 if ratio == draw.CSA else 2, topk=topk, lse=False
        )
        inputs = to_device(build(torch.Generator().manual_seed(0), torch.bfloat16), torch.device(dev))
        cost = work("compressed_attention", inputs)
        return inputs, cost.flops, cost.bytes

    return Bench("compressed_attention", name, "bfloat16", make)


def compressed_attention_benches(s: Sizes) -> list[Bench]:
    """Decode at the decode batch and a chunked prefill at the prefill chunks, HCA and CSA."""
    (b, length), (sp, tp) = s.decode, s.prefill
    full = length >= 1024
    flash, pro = (draw.V4_FLASH, draw.V4_PRO) if full else (draw.V4Attention(4, 64, 8), draw.V4Attention(8, 64, 8))
    hca, topk = (draw.HCA, 512) if full else (8, 4)
    decode, prefill = [(1, length)] * b, [(tp, length + tp)] * sp
    cases = [
        _bench(f"deepseek-v4-flash H{flash.heads} hca m{hca} decode B{b} L{length}", flash, hca, decode, 0),
        _bench(f"deepseek-v4-flash H{flash.heads} csa m4 top{topk} decode B{b} L{length}", flash, 4, decode, topk),
        _bench(f"deepseek-v4-pro H{pro.heads} csa m4 top{topk} decode B{b} L{length}", pro, 4, decode, topk),
        _bench(f"deepseek-v4-flash H{flash.heads} hca m{hca} chunked-prefill {sp}x{tp} after {length}", flash, hca,
               prefill, 0),
        _bench(f"deepseek-v4-flash H{flash.heads} csa m4 top{topk} chunked-prefill {sp}x{tp} after {length}", flash, 4,
               prefill, topk),
    ]  # fmt: skip
    return cases if full else cases[::2]  # smoke: HCA and CSA decode, CSA prefill
