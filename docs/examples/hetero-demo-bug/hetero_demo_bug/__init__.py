"""``demo_bug``: the reference backend with one bug that only a real model run shows.

Its ``paged_attention`` scales the output of every query row at position 64 or later by 1.03
when the head dim is below 64, as a tiled kernel path for long contexts and small heads might.
Conformance's quick tier (head dims 64 and 128) never takes that path; a tiny Qwen3 (head dim
32) with a prompt past 64 tokens does. docs/finding-bugs.md hunts it down.
"""

from __future__ import annotations

import torch

import hetero
from hetero_cpu_ref.plugin import CpuRefBackend

__all__ = ["DemoBugBackend", "hetero_backends"]


class DemoBugBackend(CpuRefBackend):
    name = "demo_bug"
    priority = -2000  # never chosen by auto-detection
    #: the first query position whose output is off
    from_position = 64

    def paged_attention(
        self,
        query,
        k_cache,
        v_cache,
        meta,
        *,
        scale,
        causal=True,
        window=(-1, -1),
        softcap=0.0,
        sinks=None,
        out=None,
        return_lse=False,
    ):
        result = super().paged_attention(
            query,
            k_cache,
            v_cache,
            meta,
            scale=scale,
            causal=causal,
            window=window,
            softcap=softcap,
            sinks=sinks,
            out=out,
            return_lse=return_lse,
        )
        o = result[0] if return_lse else result
        if query.shape[-1] < 64:
            starts, lens = meta.query_start_loc.tolist(), meta.seq_lens.tolist()
            for b, length in enumerate(lens):
                rows = torch.arange(starts[b], starts[b + 1])
                positions = length - len(rows) + torch.arange(len(rows))
                o[rows[positions >= self.from_position]] *= 1.03
        return result


@hetero.hookimpl
def hetero_backends() -> list[type[hetero.Backend]]:
    return [DemoBugBackend]
