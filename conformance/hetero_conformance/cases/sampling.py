"""Cases of rejection_sample (spec 1.10): speculative decoding's verification of draft tokens.

At the vocabularies of Qwen3 (151936) and DeepSeek-V3 (129280), with 1 to 8 draft tokens a request
mixed in one batch: all greedy, greedy and random mixed (with draft probabilities), all random, the
draft-probability-free (n-gram) mode, requests with no draft token, a batch of none, a batch whose
requests draft nothing, and an output wider than the longest request. Outputs are compared exactly:
the random draws are the spec's.

The statistical cases check the contract itself, not only agreement with the reference: 2000
one-draft requests over a fixed pair (p, q) of 8-token rows with draft tokens drawn from q, and the
emitted tokens must follow p (Pearson's chi-squared, 7 degrees of freedom, failing above 30: a
p-value under 1e-4; the seeds are fixed, so the verdict is too). A recovered token drawn from p in
place of the residual moves the emitted distribution to min(p, q) + (1 - sum min(p, q)) p.
"""

from __future__ import annotations

from typing import Any

import torch

from hetero.verify.case import Case
from hetero.verify.inputs import sampling as draw

__all__ = ["cases", "chi_squared"]

QWEN3_VOCAB, DSV3_VOCAB = 151936, 129280
MIXED_K = (3, 1, 8, 5, 2, 7, 4, 6)
P8 = (0.30, 0.22, 0.16, 0.12, 0.08, 0.06, 0.04, 0.02)
Q8 = (0.02, 0.04, 0.06, 0.08, 0.12, 0.16, 0.22, 0.30)
STAT_REQUESTS = 2000
CHI2_LIMIT = 30.0


def chi_squared(tokens: torch.Tensor, p: torch.Tensor) -> float:
    """Pearson's statistic of the token counts against n * p."""
    counts = torch.bincount(tokens.to(torch.int64), minlength=p.numel()).to(torch.float64)
    expected = tokens.numel() * p.to(torch.float64)
    return float(((counts - expected) ** 2 / expected).sum())


def _follows_target(inputs: dict[str, Any], outputs: dict[str, torch.Tensor]) -> str | None:
    first = outputs["out"].detach().cpu()[:, 0]
    p = inputs["target_probs"][0].cpu()
    if bool((first < 0).any() or (first >= p.numel()).any()):
        return "emitted tokens outside the vocabulary"
    stat = chi_squared(first, p)
    if stat > CHI2_LIMIT:
        return f"the emitted tokens do not follow p_target: chi-squared {stat:.1f} > {CHI2_LIMIT} (7 dof)"
    return None


def cases() -> list[Case]:
    dt = "float32"
    rows = [  # (shape, builder, vocab, quick)
        ("qwen3.k1-8.greedy", draw.batch(MIXED_K, QWEN3_VOCAB), QWEN3_VOCAB, True),
        ("deepseek-v3.k1-8.mixed", draw.batch(MIXED_K, DSV3_VOCAB, greedy="mixed"), DSV3_VOCAB, True),
        ("qwen3.k1-8.random", draw.batch(MIXED_K[:4], QWEN3_VOCAB, greedy="none", agree=0.3), QWEN3_VOCAB, False),
        ("qwen3.k1-8.ngram", draw.batch(MIXED_K, QWEN3_VOCAB, greedy="mixed", draft_free=True), QWEN3_VOCAB, False),
        ("v1000.k0-rows.mixed", draw.batch((0, 3, 0, 2, 0), 1000, greedy="mixed"), 1000, True),
        ("v1000.k0-rows.greedy", draw.batch((2, 0, 4), 1000), 1000, False),
        ("v1000.b0", draw.batch((), 1000, greedy="mixed", max_spec_len=3), 1000, False),
        ("v1000.n0", draw.batch((0, 0, 0), 1000, greedy="mixed", max_spec_len=2), 1000, False),
        ("v1000.wide", draw.batch((1, 2), 1000, greedy="mixed", max_spec_len=5), 1000, False),
        ("v97.k1-8.random.agree0", draw.batch(MIXED_K, 97, greedy="none", agree=0.0), 97, True),
        ("v97.k1-8.ngram", draw.batch(MIXED_K, 97, greedy="mixed", draft_free=True), 97, True),
    ]
    out = [Case("rejection_sample", shape, dt, build, {"dtype": dt, "vocab": v}, q) for shape, build, v, q in rows]
    for shape, q in (("v8.stat.draft", Q8), ("v8.stat.ngram", None)):
        build = draw.fixed(P8, q, STAT_REQUESTS)
        out.append(Case("rejection_sample", shape, dt, build, {"dtype": dt, "vocab": 8}, True, check=_follows_target))
    return out
