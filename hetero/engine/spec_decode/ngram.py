"""N-gram drafting (prompt lookup): the tokens that followed the latest earlier occurrence of the
request's longest matching suffix."""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["propose_ngram"]


def propose_ngram(tokens: Sequence[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to ``k`` draft tokens for a request whose tokens so far are ``tokens``.

    For n from ``max_n`` down to ``min_n``: if the last n tokens occurred earlier (an occurrence
    ending before the last token), the draft is the up-to-k tokens after the latest such occurrence;
    the first n that matches wins. No match: no draft.
    """
    total = len(tokens)
    if k <= 0 or total < min_n + 1:
        return []
    arr = np.asarray(tokens, dtype=np.int64)
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = arr[total - n :]
        # windows starting at s = 0 .. total-n-1 (ending before the suffix itself starts at total-n)
        windows = np.lib.stride_tricks.sliding_window_view(arr[: total - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return arr[start : start + k].tolist()
    return []
