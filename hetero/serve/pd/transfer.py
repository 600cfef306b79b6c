"""The two ends of a ``KVLink`` as the servers use them: ``KVSender`` on the prefill instance queues
caches to send, ``KVReceiver`` on the decode instance receives them and hands each to the request
that names its transfer id. Each owns one thread, so gloo calls never block the event loop."""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time

from hetero.engine.runtime.cache_io import SequenceCache
from hetero.serve.pd.link import KVLink
from hetero.serve.pd.wire import Assembly, header_of, payloads

__all__ = ["KVSender", "KVReceiver"]

log = logging.getLogger("hetero.serve")

#: a received cache no request claimed in this long is dropped (its router gave up on it)
UNCLAIMED_S = 120.0


class KVSender:
    """Sends caches over ``link`` in the order they were queued, in blocks of ``tokens_per_block``."""

    def __init__(self, link: KVLink, tokens_per_block: int):
        self.link, self.tokens_per_block = link, tokens_per_block
        self.error: BaseException | None = None
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name="hetero-kv-sender", daemon=True).start()

    async def send(self, transfer_id: str, cache: SequenceCache) -> int:
        """Send ``cache`` as ``transfer_id``; the bytes sent, once they are on their way."""
        if self.error is not None:
            raise RuntimeError(f"the KV link to the decode instance is down: {self.error}")
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((transfer_id, cache, done))
        return await asyncio.wrap_future(done)

    def _run(self) -> None:
        while True:
            transfer_id, cache, done = self._jobs.get()
            if self.error is not None:
                done.set_exception(RuntimeError(f"the KV link to the decode instance is down: {self.error}"))
                continue
            header = header_of(cache, transfer_id, self.link.identity, self.tokens_per_block)
            try:
                done.set_result(self.link.send(header, payloads(cache, header)))
            except Exception as e:  # noqa: BLE001  (a broken link fails this and every later transfer)
                self.error = e
                log.error("KV link to the decode instance failed: %s", e)
                done.set_exception(RuntimeError(f"the KV link to the decode instance failed: {e}"))


class KVReceiver:
    """Receives every transfer on ``link``; ``take(transfer_id)`` waits for one. ``bind`` gives it
    the event loop its takers run on, before the first transfer can arrive."""

    def __init__(self, link: KVLink, max_tokens: int):
        self.link, self.max_tokens = link, max_tokens
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._ready: dict[str, tuple[float, SequenceCache | Exception]] = {}
        self._waiting: dict[str, asyncio.Future] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        threading.Thread(target=self._run, name="hetero-kv-receiver", daemon=True).start()

    async def take(self, transfer_id: str, timeout_s: float = 60.0) -> SequenceCache:
        """The cache sent as ``transfer_id`` (ValueError if it was refused, TimeoutError if it never came)."""
        with self._lock:
            item = self._ready.pop(transfer_id, None)
            if item is None:
                if self.error is not None:
                    raise RuntimeError(f"the KV link to the prefill instance is down: {self.error}")
                future = self._waiting[transfer_id] = asyncio.get_running_loop().create_future()
        if item is None:
            try:
                item = await asyncio.wait_for(future, timeout_s)
            except asyncio.TimeoutError:
                raise TimeoutError(f"KV transfer {transfer_id!r} did not arrive within {timeout_s:g} s") from None
            finally:
                with self._lock:
                    self._waiting.pop(transfer_id, None)
        if isinstance(item[1], Exception):
            raise item[1]
        return item[1]

    def _run(self) -> None:
        try:
            while True:
                header = self.link.recv_header()
                self._arrive(str(header.get("transfer_id")), self._receive(header))
        except Exception as e:  # noqa: BLE001  (the peer is gone or broke the protocol: every taker learns it)
            log.error("KV link to the prefill instance failed: %s", e)
            with self._lock:
                self.error = e
                waiting, self._waiting = list(self._waiting.values()), {}
            for future in waiting:
                self._loop.call_soon_threadsafe(_fail, future, RuntimeError(f"the KV link failed: {e}"))

    def _receive(self, header: dict) -> SequenceCache | Exception:
        """The transfer's cache, or why it was refused (its payloads drained, so the link stays in step)."""
        try:
            assembly = Assembly(header, self.link.identity, self.max_tokens)
        except ValueError as e:
            for _ in self.link.recv_payloads(header):
                pass
            return e
        for index, data in enumerate(self.link.recv_payloads(header)):
            assembly.take(index, data)
        return assembly.result()

    def _arrive(self, transfer_id: str, item: SequenceCache | Exception) -> None:
        now = time.monotonic()
        with self._lock:
            for stale in [k for k, (at, _) in self._ready.items() if now - at > UNCLAIMED_S]:
                log.warning("KV transfer %r was never claimed; dropped", stale)
                del self._ready[stale]
            future = self._waiting.pop(transfer_id, None)
            if future is None:
                self._ready[transfer_id] = (now, item)
        if future is not None:
            self._loop.call_soon_threadsafe(_settle, future, (now, item))


def _settle(future: asyncio.Future, item) -> None:
    if not future.done():
        future.set_result(item)


def _fail(future: asyncio.Future, error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
