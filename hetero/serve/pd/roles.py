"""What ``--role prefill`` and ``--role decode`` add to a server's completions endpoints.

A request whose ``kv_transfer_params`` has ``do_remote_decode`` is, on a prefill instance, computed
up to its last prompt token; that cache goes over the KV link and the answer is its
``kv_transfer_params`` (``transfer_id``, ``num_tokens``), which the router passes to the decode
instance with the same request. There the cache is imported and only the last prompt token and
the output are computed, as vLLM's disaggregated prefill recomputes the last token on the decode
side. A one-token prompt has nothing to ship (``transfer_id`` null).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from hetero.engine import LLM
from hetero.engine.runtime.cache_io import SequenceCache
from hetero.errors import UsageError
from hetero.serve.engine_loop import EngineLoop
from hetero.serve.metrics import LATENCY_BUCKETS
from hetero.serve.pd.transfer import KVReceiver, KVSender

__all__ = ["PrefillRole", "DecodeRole", "Unavailable"]


class Unavailable(Exception):
    """The KV link cannot serve this request now (HTTP 503)."""


class _Counters:
    def __init__(self, registry: CollectorRegistry, role: str):
        self.transfers = Counter(
            "hetero_kv_transfers", "KV caches sent (prefill) or received (decode)", ("role",), registry=registry
        ).labels(role)
        self.bytes = Counter(
            "hetero_kv_transfer_bytes", "Bytes of KV caches sent or received", ("role",), registry=registry
        ).labels(role)
        self.seconds = Histogram(
            "hetero_kv_transfer_seconds",
            "Prefill: sending a cache over the link (from the queue of the link's thread); decode: waiting for it",
            ("role",),
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ).labels(role)


class PrefillRole:
    """Computes prompts' caches on this instance and sends them over ``sender``."""

    def __init__(self, sender: KVSender, registry: CollectorRegistry):
        self.sender, self.counters = sender, _Counters(registry, "prefill")

    @property
    def error(self) -> BaseException | None:
        return self.sender.error

    async def prefill(self, engine: EngineLoop, llm: LLM, prompt: str | list[int]) -> dict[str, Any]:
        """The ``kv_transfer_params`` the decode instance needs for ``prompt``."""
        ids = llm.encode(prompt)
        if not 2 <= len(ids) < llm.config.max_model_len:
            # nothing to ship, or no room to run the prompt but its last token and stop after one
            # token: the decode instance computes it all, and answers as one server would
            return {"kv_transfer_params": {"transfer_id": None, "num_tokens": 0}}
        try:
            cache = await engine.export(ids[:-1])
        except UsageError:  # a bad request: the client's 400
            raise
        except Exception as e:  # noqa: BLE001  (the instance's fault, not the request's)
            raise Unavailable(f"the prefill instance could not compute the prompt's cache: {e}") from None
        transfer_id = uuid.uuid4().hex
        start = time.perf_counter()
        try:
            sent = await self.sender.send(transfer_id, cache)
        except RuntimeError as e:
            raise Unavailable(str(e)) from None
        self.counters.transfers.inc()
        self.counters.bytes.inc(sent)
        self.counters.seconds.observe(time.perf_counter() - start)
        return {"kv_transfer_params": {"transfer_id": transfer_id, "num_tokens": cache.num_tokens, "bytes": sent}}


class DecodeRole:
    """Takes the caches ``receiver`` got for the requests that name them."""

    def __init__(self, receiver: KVReceiver, registry: CollectorRegistry, timeout_s: float = 60.0):
        self.receiver, self.timeout_s, self.counters = receiver, timeout_s, _Counters(registry, "decode")

    @property
    def error(self) -> BaseException | None:
        return self.receiver.error

    async def cache(self, params: dict[str, Any]) -> SequenceCache | None:
        """The cache ``params["transfer_id"]`` names (None when it names none)."""
        transfer_id = params.get("transfer_id")
        if transfer_id is None:
            return None
        start = time.perf_counter()
        try:
            cache = await self.receiver.take(str(transfer_id), self.timeout_s)
        except Exception as e:  # noqa: BLE001  (a lost or refused transfer: the pair's fault, not the client's)
            raise Unavailable(str(e)) from None
        self.counters.transfers.inc()
        self.counters.bytes.inc(sum(t.nbytes for t in (*cache.paged.values(), *cache.state.values())))
        self.counters.seconds.observe(time.perf_counter() - start)
        return cache
