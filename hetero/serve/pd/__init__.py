"""Prefill/decode disaggregation: ``hetero serve --role prefill|decode|router``.

A prefill instance computes prompts' caches, a decode instance generates from them, and a router
fronts both with the OpenAI API. The two instances may run different backends on different
chips: the cache moves in a hardware-neutral layout (``wire``) over a torch.distributed gloo link
(``link``), after both sides proved they serve the same model with the same cache layout
(``identity``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetero.errors import UsageError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from hetero.engine import LLM
    from hetero.serve.pd.roles import DecodeRole, PrefillRole

__all__ = ["open_role"]


def open_role(
    llm: "LLM", role: str, addr: str, timeout_s: float, registry: "CollectorRegistry"
) -> "PrefillRole | DecodeRole":
    """Meet the peer at ``addr`` (waiting up to ``timeout_s``) and return this instance's role.

    Raises ``KVLinkRefused`` (a UsageError) when the peer serves another model or cache layout."""
    from hetero.serve.pd.identity import Identity
    from hetero.serve.pd.link import connect
    from hetero.serve.pd.roles import DecodeRole, PrefillRole
    from hetero.serve.pd.transfer import KVReceiver, KVSender
    from hetero.serve.pd.wire import tokens_per_payload

    if llm.world.size > 1:
        raise UsageError(
            f"hetero serve --role {role}: disaggregation needs one process (tensor and pipeline parallel "
            f"size 1) on both instances (an exported cache is one rank's shard), got {llm.world.size}",
            arg="--tensor-parallel-size",
            expected=1,
            got=llm.world.size,
        )
    link = connect(role, addr, Identity.of(llm, role), timeout_s)
    if role == "prefill":
        return PrefillRole(KVSender(link, tokens_per_payload(link.identity, llm.config.block_size)), registry)
    return DecodeRole(KVReceiver(link, llm.config.max_model_len), registry)
