"""What ``--role prefill`` and ``--role decode`` add to a server's completions endpoints, in the request
protocol of vLLM's disaggregated serving (NIXL-style ``kv_transfer_params``), so vllm-router's PD mode
fronts hetero instances as it fronts vLLM's.

A request whose ``kv_transfer_params`` has ``do_remote_decode`` is, on a prefill instance, computed
up to its last prompt token; the instance holds that cache and answers with a completion whose
``kv_transfer_params`` say where to pull it (``remote_host``, ``remote_port``, ``remote_engine_id``,
``remote_request_id``). The router passes them to a decode instance with the same request; there,
``do_remote_prefill`` pulls the cache and only the last prompt token and the output are computed, as
vLLM's disaggregated prefill recomputes the last token on the decode side. A one-token prompt has
nothing to ship (``do_remote_prefill`` false).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, Counter, Histogram

from hetero.engine import LLM
from hetero.engine.runtime.cache_io import SequenceCache
from hetero.errors import UsageError
from hetero.serve._disconnect import ClientGone, unless_gone
from hetero.serve.engine_loop import EngineLoop
from hetero.serve.metrics import LATENCY_BUCKETS
from hetero.serve.pd.link import KVLinkRefused
from hetero.serve.pd.transfer import KVPuller, KVSource

__all__ = ["PrefillRole", "DecodeRole", "Unavailable", "wants_prefill", "prefill", "imported"]

PARAMS = "kv_transfer_params"


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
            "Prefill: sending a cache over a link; decode: pulling it (dialing the link included)",
            ("role",),
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ).labels(role)

    def count(self, sent: int, seconds: float) -> None:
        self.transfers.inc()
        self.bytes.inc(sent)
        self.seconds.observe(seconds)


class PrefillRole:
    """Computes prompts' caches on this instance and holds them in ``source`` for the decode instances."""

    def __init__(self, source: KVSource, registry: CollectorRegistry):
        self.source, self.counters = source, _Counters(registry, "prefill")
        source.on_sent = self.counters.count

    @property
    def error(self) -> BaseException | None:
        return self.source.error

    def close(self) -> None:
        self.source.close()

    async def params(self, engine: EngineLoop, llm: LLM, ids: list[int]) -> dict[str, Any]:
        """The ``kv_transfer_params`` a decode instance needs for the prompt ``ids``."""
        if not 2 <= len(ids) < llm.config.max_model_len:
            # nothing to ship, or no room to run the prompt but its last token and stop after one
            # token: the decode instance computes it all, and answers as one server would
            return {"do_remote_prefill": False, "do_remote_decode": False}
        try:
            cache = await engine.export(ids[:-1])
        except UsageError:  # a bad request: the client's 400
            raise
        except Exception as e:  # noqa: BLE001  (the instance's fault, not the request's)
            raise Unavailable(f"the prefill instance could not compute the prompt's cache: {e}") from None
        server = self.source.server
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": server.engine_id,
            "remote_host": server.host,
            "remote_port": server.port,
            "remote_request_id": self.source.hold(cache),
            "num_tokens": cache.num_tokens,
            "tp_size": 1,
        }


class DecodeRole:
    """Pulls the caches that requests name through ``puller``."""

    def __init__(self, puller: KVPuller, registry: CollectorRegistry):
        self.puller, self.counters = puller, _Counters(registry, "decode")
        self.error: BaseException | None = None  # a link that fails fails its requests, not the instance

    def close(self) -> None:
        self.puller.close()

    async def cache(self, params: dict[str, Any]) -> SequenceCache:
        """The cache ``params`` (a prefill instance's answer) name."""
        host, port, engine_id, transfer_id = _where(params)
        start = time.perf_counter()
        try:
            cache = await self.puller.pull(host, port, engine_id, transfer_id)
        except KVLinkRefused as e:
            raise Unavailable(str(e)) from None
        except ValueError as e:  # the cache does not fit this instance (e.g. longer than its max_model_len)
            raise UsageError(str(e), arg=PARAMS) from None
        except Exception as e:  # noqa: BLE001  (a lost transfer or link: the pair's fault, not the client's)
            raise Unavailable(str(e)) from None
        self.counters.count(
            sum(t.nbytes for t in (*cache.paged.values(), *cache.state.values())), time.perf_counter() - start
        )
        return cache


def _where(params: dict[str, Any]) -> tuple[str, int, str, str]:
    expect = {"remote_host": str, "remote_port": int, "remote_engine_id": str, "remote_request_id": str}
    for key, kind in expect.items():
        value = params.get(key)
        if not isinstance(value, kind) or isinstance(value, bool) or not value:
            raise UsageError(
                f"{PARAMS}.{key}: expected a {kind.__name__} from the prefill instance's answer, got {value!r}",
                arg=f"{PARAMS}.{key}",
                expected=kind.__name__,
                got=value,
            )
    if not 0 < params["remote_port"] < 65536 or len(params["remote_request_id"]) > 64:
        raise UsageError(f"{PARAMS}: remote_port or remote_request_id out of range", arg=PARAMS, got=params)
    return params["remote_host"], params["remote_port"], params["remote_engine_id"], params["remote_request_id"]


def wants_prefill(body, pd) -> bool:
    """Whether ``body`` asks this instance for a prefill only (answered with ``kv_transfer_params``, no tokens)."""
    if not (body.kv_transfer_params or {}).get("do_remote_decode"):
        return False
    if not isinstance(pd, PrefillRole):
        raise UsageError(
            f"{PARAMS}.do_remote_decode: this server is not a prefill instance (hetero serve --role prefill)",
            arg=PARAMS,
        )
    return True


async def imported(body, pd) -> SequenceCache | None:
    """The cache a decode request's ``kv_transfer_params`` name (None: none). Pulled before the request is
    checked, so a refused request leaves no cache behind on the prefill instance."""
    params = body.kv_transfer_params or {}
    if not params.get("do_remote_prefill"):
        return None
    if not isinstance(pd, DecodeRole):
        raise UsageError(
            f"{PARAMS}.do_remote_prefill: this server is not a decode instance (hetero serve --role decode)", arg=PARAMS
        )
    return await pd.cache(params)


async def prefill(
    pd: PrefillRole, engine: EngineLoop, llm: LLM, ids: list[int], request: Request, model: str, chat: bool
):
    """The prefill leg's answer: an empty completion (finished by length, as ``max_tokens`` 1 asks) with
    the ``kv_transfer_params`` for the decode leg."""
    try:
        params = await unless_gone(request, pd.params(engine, llm, ids))
    except ClientGone:  # the router gave up: the export is aborted
        return Response(status_code=499)
    choice: dict[str, Any] = {"index": 0, "finish_reason": "length", "logprobs": None}
    choice.update({"message": {"role": "assistant", "content": ""}} if chat else {"text": ""})
    return {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {"prompt_tokens": len(ids), "completion_tokens": 0, "total_tokens": len(ids)},
        PARAMS: params,
    }
