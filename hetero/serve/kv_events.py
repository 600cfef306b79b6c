"""KV events of ``hetero serve`` as vLLM publishes them, for a cache-aware router (vllm-router's kv_aware).

``--kv-events-config`` takes vLLM's ``kv_events_config`` keys. Each step's events (``BlockStored`` when a
full block is computed and registered in the prefix cache, ``BlockRemoved`` when it is evicted,
``hetero.engine.kv_events``) go out as one batch on a ZMQ PUB socket bound at ``endpoint``: the
frames ``[topic, sequence number (8 bytes, big-endian), msgpack([timestamp, [event maps], data-parallel
rank 0])]``, the sequence counting batches from 0. ``/kv_event_sources`` tells a router where to subscribe.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from hetero.engine.kv_events import to_wire
from hetero.errors import UsageError

__all__ = ["KVEventsConfig", "KVEventPublisher"]

_KEYS = {
    "enable_kv_cache_events",
    "publisher",
    "endpoint",
    "replay_endpoint",
    "topic",
    "hwm",
    "buffer_steps",
    "max_queue_size",
}


def _bad(key: str, expected: str, got: Any) -> UsageError:
    return UsageError(
        f"argument --kv-events-config: {key}: expected {expected}, got {got!r}",
        arg=f"kv_events_config.{key}",
        expected=expected,
        got=got,
    )


@dataclass(frozen=True)
class KVEventsConfig:
    """vLLM's ``kv_events_config``: ``enable_kv_cache_events``, ``publisher`` ("zmq" or "null"), ``endpoint``
    (bound; default tcp://*:5557), ``topic`` (default ""), ``hwm`` (the socket's send high-water mark).
    ``replay_endpoint`` is refused: hetero keeps no replay buffer, so a router that missed a batch falls
    back to its own state until the blocks are stored again. ``buffer_steps`` and ``max_queue_size`` are
    accepted and have no effect here (events are sent on the engine's thread as each step ends)."""

    enable_kv_cache_events: bool = False
    publisher: str = "zmq"
    endpoint: str = "tcp://*:5557"
    topic: str = ""
    hwm: int = 100_000

    @classmethod
    def parse(cls, text: str | None) -> "KVEventsConfig | None":
        """The config of ``--kv-events-config`` (JSON), or None when absent or not enabled."""
        if text is None:
            return None
        try:
            raw = json.loads(text)
        except ValueError as e:
            raise UsageError(f"argument --kv-events-config: not JSON: {e}") from None
        if not isinstance(raw, dict):
            raise _bad("(the value)", "a JSON object", raw)
        for key in raw:
            if key not in _KEYS:
                raise _bad(key, f"one of {', '.join(sorted(_KEYS))}", key)
        if raw.get("replay_endpoint") is not None:
            raise _bad("replay_endpoint", "null (hetero keeps no replay buffer)", raw["replay_endpoint"])
        if raw.get("publisher", "zmq") not in ("zmq", "null"):
            raise _bad("publisher", '"zmq" or "null"', raw["publisher"])
        for key, kind in (("enable_kv_cache_events", bool), ("endpoint", str), ("topic", str), ("hwm", int)):
            if key in raw and (not isinstance(raw[key], kind) or (kind is int and isinstance(raw[key], bool))):
                raise _bad(key, f"a {kind.__name__}", raw[key])
        cfg = cls(
            **{k: raw[k] for k in ("enable_kv_cache_events", "publisher", "endpoint", "topic", "hwm") if k in raw}
        )
        return cfg if cfg.enable_kv_cache_events and cfg.publisher == "zmq" else None


class KVEventPublisher:
    """A bound ZMQ PUB socket sending each step's events as one batch (see the module docstring). Built on
    the thread that serves; ``publish`` is called from the engine's thread only."""

    def __init__(self, config: KVEventsConfig):
        import zmq

        self.config = config
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.PUB)
        self._socket.setsockopt(zmq.SNDHWM, config.hwm)
        self._socket.setsockopt(zmq.LINGER, 0)
        try:
            self._socket.bind(config.endpoint)
        except zmq.ZMQError as e:
            self.close()
            raise UsageError(f"argument --kv-events-config: endpoint {config.endpoint!r} cannot be bound: {e}") from e
        self.seq = 0

    def publish(self, events: list) -> None:
        """Send ``events`` (``hetero.engine.kv_events``) as the next batch; nothing when empty."""
        if not events:
            return
        import msgpack

        payload = msgpack.packb([time.time(), [to_wire(e) for e in events], 0], use_bin_type=True)
        self._socket.send_multipart([self.config.topic.encode(), self.seq.to_bytes(8, "big"), payload])
        self.seq += 1

    def source(self) -> dict[str, Any]:
        """This publisher as ``/kv_event_sources`` describes it (one data-parallel rank, "0")."""
        c = self.config
        return {
            "endpoint": c.endpoint,
            "replay_endpoint": None,
            "topic": c.topic,
            "hwm": c.hwm,
            "publisher": "zmq",
            "enable_kv_cache_events": True,
        }

    def close(self) -> None:
        self._socket.close(0)
        self._context.term()
