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

#: by default, a received cache no request claimed in this long is dropped (its router gave up on it)
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
            if not done.set_running_or_notify_cancel():  # its waiter gave up before it was sent
                continue
            if self.error is not None:
                _resolve(done, error=RuntimeError(f"the KV link to the decode instance is down: {self.error}"))
                continue
            try:
                header = header_of(cache, transfer_id, self.link.identity, self.tokens_per_block)
                sent = self.link.send(header, payloads(cache, header))
            except Exception as e:  # noqa: BLE001  (a broken link fails this and every later transfer)
                self.error = e
                log.error("KV link to the decode instance failed: %s", e)
                self.link.close()
                _resolve(done, error=RuntimeError(f"the KV link to the decode instance failed: {e}"))
                continue
            _resolve(done, sent)


def _resolve(done: concurrent.futures.Future, result: object = None, error: BaseException | None = None) -> None:
    """Settle a running job's future (a running future cannot be cancelled any more)."""
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(result)


class KVReceiver:
    """Receives every transfer on ``link``; ``take(transfer_id)`` waits for one. ``bind`` gives it
    the event loop its takers run on, before the first transfer can arrive. A cache nobody takes
    within ``unclaimed_s`` is dropped."""

    def __init__(self, link: KVLink, max_tokens: int, unclaimed_s: float = UNCLAIMED_S):
        self.link, self.max_tokens, self.unclaimed_s = link, max_tokens, unclaimed_s
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._ready: dict[str, tuple[float, SequenceCache | Exception]] = {}
        self._waiting: dict[str, asyncio.Future] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        threading.Thread(target=self._run, name="hetero-kv-receiver", daemon=True).start()
        self._sweep()

    async def take(self, transfer_id: str, timeout_s: float = 60.0) -> SequenceCache:
        """The cache sent as ``transfer_id`` (ValueError if it was refused, TimeoutError if it never came)."""
        with self._lock:
            item = self._ready.pop(transfer_id, None)
            if item is None:
                if self.error is not None:
                    raise RuntimeError(f"the KV link to the prefill instance is down: {self.error}")
                if transfer_id in self._waiting:
                    raise ValueError(f"KV transfer {transfer_id!r} is already being waited for by another request")
                future = self._waiting[transfer_id] = asyncio.get_running_loop().create_future()
        if item is None:
            try:
                item = await asyncio.wait_for(future, timeout_s)
            except asyncio.TimeoutError:
                raise TimeoutError(f"KV transfer {transfer_id!r} did not arrive within {timeout_s:g} s") from None
            finally:
                with self._lock:
                    if self._waiting.get(transfer_id) is future:
                        del self._waiting[transfer_id]
        if isinstance(item[1], Exception):
            raise item[1]
        return item[1]

    def _sweep(self) -> None:
        """Drop the caches nobody claimed in time (their router gave up); again in a while."""
        now = time.monotonic()
        with self._lock:
            stale = [k for k, (at, _) in self._ready.items() if now - at > self.unclaimed_s]
            for k in stale:
                del self._ready[k]
        for k in stale:
            log.warning("KV transfer %r was never claimed; dropped", k)
        self._loop.call_later(self.unclaimed_s / 4, self._sweep)

    def _run(self) -> None:
        try:
            while True:
                header = self.link.recv_header()
                self._arrive(str(header.get("transfer_id")), self._receive(header))
        except Exception as e:  # noqa: BLE001  (the peer is gone or broke the protocol: every taker learns it)
            log.error("KV link to the prefill instance failed: %s", e)
            self.link.close()  # a prefill instance still sending learns it too, rather than wait
            with self._lock:
                self.error = e
                waiting, self._waiting = list(self._waiting.values()), {}
            for future in waiting:
                self._loop.call_soon_threadsafe(_fail, future, RuntimeError(f"the KV link failed: {e}"))

    def _receive(self, header: dict) -> SequenceCache | Exception:
        """The transfer's cache, or why it was refused. Every payload is received either way, so the
        link stays in step; only a failure of the link itself escapes."""
        try:
            assembly: Assembly | None = Assembly(header, self.link.identity, self.max_tokens)
            problem: Exception | None = None
        except ValueError as e:
            assembly, problem = None, e
        for index, data in enumerate(self.link.recv_payloads(header, window=4 if assembly else 1)):
            if assembly is not None:
                try:
                    assembly.take(index, data)
                except Exception as e:  # noqa: BLE001  (this transfer is lost, the link is not)
                    assembly, problem = None, e
        if assembly is None:
            return problem
        try:
            return assembly.result()
        except Exception as e:  # noqa: BLE001
            return e

    def _arrive(self, transfer_id: str, item: SequenceCache | Exception) -> None:
        with self._lock:
            future = self._waiting.pop(transfer_id, None)
            if future is None:
                self._ready[transfer_id] = (time.monotonic(), item)
        if future is not None:
            self._loop.call_soon_threadsafe(_settle, future, (time.monotonic(), item))


def _settle(future: asyncio.Future, item) -> None:
    if not future.done():
        future.set_result(item)


def _fail(future: asyncio.Future, error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
