"""Comparing two runs of ``_driver.py``: identical greedy tokens, top-k logprobs within a tolerance."""
from __future__ import annotations

from typing import Any

__all__ = ["assert_same_generation"]


def assert_same_generation(got: list[dict[str, Any]], want: list[dict[str, Any]], atol: float = 1e-5) -> float:
    """Raise AssertionError at the first differing token or logprob; returns the largest |logprob difference|."""
    assert len(got) == len(want), f"{len(got)} sequences, expected {len(want)}"
    worst = 0.0
    for i, (g, w) in enumerate(zip(got, want)):
        assert g["tokens"] == w["tokens"], f"sequence {i}: tokens {g['tokens']} != stock {w['tokens']}"
        for step, (gl, wl) in enumerate(zip(g["logprobs"], w["logprobs"])):
            assert gl.keys() == wl.keys(), f"sequence {i} step {step}: top-k ids {sorted(gl)} != stock {sorted(wl)}"
            for token, value in wl.items():
                diff = abs(gl[token] - value)
                assert diff <= atol, f"sequence {i} step {step} token {token}: logprob {gl[token]} vs stock {value}"
                worst = max(worst, diff)
    return worst
