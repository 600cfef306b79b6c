"""The rejection_sample (spec 1.10) cases of scripts/gpu_check.py: speculative decoding's verification step of a
decode batch at Qwen3's vocabulary (151936), 64 requests drafting 4 tokens each (MTP or EAGLE-3's usual k),
greedy and random (with draft probabilities) in one batch, and the draft-free (n-gram) form.

Bytes: the target probabilities (and the draft's) read once, the ids and seeds, the output written once;
the random kernel reads a row twice (its argmax and weight total, then the inverse CDF) and the roofline
counts it once, so the fraction it shows is an upper bound's. Flops: a few per probability.
"""

from __future__ import annotations

import torch
from gpu_check_sizes import Bench, Sizes, nbytes

__all__ = ["sampling_benches"]

K = 4  # draft tokens a request


def sampling_benches(s: Sizes) -> list[Bench]:
    """rejection_sample with and without draft probabilities."""
    b = max(2, min(64, s.tokens // 128))
    vocab = 151936 if s.tokens >= 1024 else 1000  # the smoke sizes run on the reference

    def make(draft_free: bool):
        def build(dev):
            n = b * K
            p = torch.softmax(3 * torch.randn(n, vocab, device=dev), -1)
            q = None if draft_free else torch.softmax(3 * torch.randn(n, vocab, device=dev), -1)
            inputs = {
                "draft_token_ids": torch.randint(0, vocab, (n,), device=dev, dtype=torch.int32),
                "cu_num_draft_tokens": torch.arange(0, n + 1, K, device=dev, dtype=torch.int32),
                "target_probs": p,
                "bonus_token_ids": torch.randint(0, vocab, (b,), device=dev, dtype=torch.int32),
                "draft_probs": q,
                "max_spec_len": K,
                "is_greedy": torch.arange(b, device=dev) % 2 == 0,
                "seeds": torch.randint(0, 2**62, (b,), device=dev),
            }
            read = nbytes(p) + (0 if q is None else nbytes(q)) + n * 4 + b * 13 + (b + 1) * 4
            return inputs, 6.0 * n * vocab * (1 if q is None else 2), read + b * (K + 1) * 4

        return build

    return [
        Bench("rejection_sample", f"qwen3 V{vocab} B{b} k{K} mixed", "float32", make(False)),
        Bench("rejection_sample", f"qwen3 V{vocab} B{b} k{K} ngram", "float32", make(True)),
    ]
