"""What the torch backend's attention family declines: the fp8 index-key format of DSA
(``write_index_k``/``indexer_topk`` with ``index_scale``) on a device whose torch cannot convert
to and from float8_e4m3fn.

Index contents need no device-side trust: every attention op reads its metadata (block ids,
lengths, slots) on the host and checks it before it gathers or scatters, and ``topk_indices``
entries outside a row's visible positions are masked, never used as an index.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

import torch

__all__ = ["ATTENTION_OPS", "attention_reason"]

ATTENTION_OPS = frozenset(
    {
        "write_kv",
        "paged_attention",
        "varlen_attention",
        "write_mla_kv",
        "mla_attention",
        "merge_attention",
        "write_index_k",
        "indexer_topk",
    }
)


@functools.lru_cache(maxsize=None)
def _fp8_casts(device: str) -> bool:
    """Whether torch converts float32 to float8_e4m3fn and back on ``device`` (ties to even)."""
    try:
        x = torch.tensor([1.0, -3.5, 0.53125, 0.59375], device=device)  # the last two are halfway: ties to even
        back = x.to(torch.float8_e4m3fn).to(torch.float32).cpu().tolist()
    except (RuntimeError, TypeError, NotImplementedError):
        return False
    return back == [1.0, -3.5, 0.5, 0.625]


def attention_reason(op: str, static: Mapping[str, Any], device: torch.device) -> str | None:
    """None when the attention op ``op`` runs natively on ``device`` with ``static``, else why not."""
    if op in ("write_index_k", "indexer_topk") and static.get("index_scale") and not _fp8_casts(str(device)):
        return f"torch on {device.type} cannot convert float8_e4m3fn, the dtype of the fp8 index-key format"
    return None
