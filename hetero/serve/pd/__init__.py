"""Prefill/decode disaggregation: ``hetero serve --role prefill|decode``.

A prefill instance computes prompts' caches and holds them; a decode instance pulls each from the
prefill instance its request names and generates from it; vllm-router's PD mode fronts them with
the OpenAI API. The instances may run different
backends on different chips: the cache moves in a hardware-neutral layout (``wire``) over
torch.distributed gloo links (``link``), made once per pair after both sides proved a shared
secret and that they serve the same model with the same cache layout (``rendezvous``,
``identity``).
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
    llm: "LLM", role: str, addr: str | None, registry: "CollectorRegistry", secret: str | None, name: str
) -> "PrefillRole | DecodeRole":
    """This instance's role: a prefill instance accepts decode instances' links at ``addr``; a decode
    instance (named ``name`` to its peers) dials each prefill instance the first time a request names
    it. Each link proves ``secret`` on both sides."""
    from hetero.serve.pd.identity import Identity
    from hetero.serve.pd.roles import DecodeRole, PrefillRole
    from hetero.serve.pd.transfer import KVPuller, KVSource
    from hetero.serve.pd.wire import tokens_per_payload

    if llm.pipeline is not None:
        raise UsageError(
            f"hetero serve --role {role}: disaggregation does not move caches under pipeline parallelism (each "
            f"stage holds its own layers' cache)",
            arg="--pipeline-parallel-size",
            expected=1,
            got=llm.config.pipeline_parallel_size,
        )
    identity = Identity.of(llm, role)
    if role == "prefill":
        source = KVSource(addr, identity, secret, tokens_per_payload(identity, llm.config.block_size))
        return PrefillRole(source, registry)
    return DecodeRole(KVPuller(identity, secret, llm.config.max_model_len, name), registry)
