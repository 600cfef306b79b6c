"""``hetero bench``'s rejection_sample (spec 1.10) cases, drawn by the conformance catalog's builder
(``hetero.verify.inputs.sampling``): a speculative decoding step's verification at Qwen3's vocabulary.

``full``: 64 requests drafting 4 tokens each (greedy and random mixed, with draft probabilities) and the
draft-free (n-gram) form. ``quick``: 8 requests, vocabulary 4096, both forms (float32, the op's only dtype).
"""

from __future__ import annotations

from typing import Callable

from hetero.verify.inputs import sampling as _sampling

__all__ = ["sampling_cases"]

QWEN3_VOCAB = 151936


def sampling_cases(add: Callable[..., None], full: bool, dt: str) -> None:
    """rejection_sample with and without draft probabilities."""
    b, vocab = (64, QWEN3_VOCAB) if full else (8, 4096)
    for form, draft_free in (("mixed", False), ("ngram", True)):
        build = _sampling.batch([4] * b, vocab, greedy="mixed", draft_free=draft_free)
        add("rejection_sample", f"qwen3-v{vocab}-b{b}-k4-{form}", build, {"dtype": "float32"}, "float32")
