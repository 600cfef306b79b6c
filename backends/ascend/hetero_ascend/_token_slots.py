"""Why ascend declines the recurrent ops' per-token state slots (spec 1.11, speculative decoding's verify
calls), which ``supports()`` sees as the static option ``num_accepted_tokens=True``."""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["REASON", "reason"]

REASON = (
    "torch_npu documents no recurrent operator that keeps the state after every token (spec 1.11's per-token "
    "state_slots [N, M] and num_accepted_tokens): never run on an NPU"
)


def reason(op: str, static: Mapping[str, Any]) -> str | None:
    """The decline of a per-token causal_conv1d or gated_delta_rule, else None."""
    if op in ("causal_conv1d", "gated_delta_rule") and static.get("num_accepted_tokens"):
        return REASON
    return None
