"""What the torch backend declines, per op and static configuration, with the reason (None: runs natively)."""

from __future__ import annotations

from typing import Any, Mapping

import torch

__all__ = ["reason"]


def reason(op: str, static: Mapping[str, Any], device: torch.device) -> str | None:
    """None when ``op`` runs natively on ``device`` with ``static`` (dtype=..., ...), else one sentence why not."""
    # --- attention family (write_kv ... indexer_topk): hetero_torch._attention_support
    from hetero_torch._attention_support import ATTENTION_OPS, attention_reason

    if op in ATTENTION_OPS:
        return attention_reason(op, static, device)
    # --- end of the attention family
    # --- layers, gemm and moe families (rms_norm ... fused_moe): hetero_torch._gemm_support
    from hetero_torch._gemm_support import DENSE_OPS, dense_reason

    if op in DENSE_OPS:
        return dense_reason(op, static, device)
    # --- end of the layers, gemm and moe families
    return None
