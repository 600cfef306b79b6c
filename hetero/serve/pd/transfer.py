"""The two ends of the KV links as the servers use them. ``KVSource`` on a prefill instance holds the
caches it computed until a decode instance pulls them; ``KVPuller`` on a decode instance pulls the
cache a request names from the prefill instance that holds it, over a link it dials the first time
and keeps (dialing again when that link broke or its peer restarted). Gloo calls run on threads of
their own, never on the event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
import uuid
from typing import Callable

from hetero.engine.runtime.cache_io import SequenceCache
from hetero.serve.pd.identity import Identity
from hetero.serve.pd.link import KVLink
from hetero.serve.pd.rendezvous import KVServer, dial
from hetero.serve.pd.wire import Assembly, header_of, payloads

__all__ = ["KVSource", "KVPuller", "Peer", "UNCLAIMED_S"]

log = logging.getLogger("hetero.serve")

#: by default, a held cache no decode instance pulled in this long is dropped (its router gave up on it)
UNCLAIMED_S = 120.0


class KVSource:
    """Serves the caches ``hold`` was given to the decode instances that pull them, in blocks of
    ``tokens_per_block`` tokens; ``on_sent(bytes, seconds)`` after each."""

    def __init__(
        self,
        addr: str,
        identity: Identity,
        secret: str | None,
        tokens_per_block: int,
        unclaimed_s: float = UNCLAIMED_S,
        on_sent: Callable[[int, float], None] = lambda n, s: None,
    ):
        self.tokens_per_block, self.unclaimed_s, self.on_sent = tokens_per_block, unclaimed_s, on_sent
        self._lock = threading.Lock()
        self._held: dict[str, tuple[float, SequenceCache]] = {}
        self._links: list[KVLink] = []
        self.server = KVServer(addr, identity, secret, self._serve)
        threading.Thread(target=self._sweep, name="hetero-kv-sweep", daemon=True).start()

    @property
    def error(self) -> BaseException | None:
        return self.server.error

    def hold(self, cache: SequenceCache) -> str:
        """Keep ``cache`` for a decode instance to pull; its transfer id."""
        transfer_id = uuid.uuid4().hex
        with self._lock:
            self._held[transfer_id] = (time.monotonic(), cache)
        return transfer_id

    def held(self) -> int:
        with self._lock:
            return len(self._held)

    def close(self) -> None:
        """Stop taking links and close the ones made (before the process exits: gloo groups alive at exit abort it)."""
        self.server.close()
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            link.close()

    def _serve(self, link: KVLink) -> None:
        with self._lock:
            self._links.append(link)
        try:
            while True:
                transfer_id = link.next_request()
                with self._lock:
                    _, cache = self._held.pop(transfer_id, (None, None))
                start = time.perf_counter()
                if cache is None:
                    missing = f"this prefill instance holds no KV transfer {transfer_id!r} (any more)"
                    link.send({"transfer_id": transfer_id, "missing": missing}, iter(()))
                    continue
                header = header_of(cache, transfer_id, link.identity, self.tokens_per_block)
                self.on_sent(link.send(header, payloads(cache, header)), time.perf_counter() - start)
        except Exception as e:  # noqa: BLE001  (the decode instance is gone or broke the protocol: this link only)
            if not self.server.closed:
                log.warning("KV link with decode instance %r ended: %s", link.peer_name, e)
            link.close()
            with self._lock:
                if link in self._links:
                    self._links.remove(link)

    def _sweep(self) -> None:
        while not self.server.closed:
            time.sleep(self.unclaimed_s / 4)
            self.drop_stale(time.monotonic())

    def drop_stale(self, now: float) -> list[str]:
        """Drop the caches held longer than ``unclaimed_s`` at ``now``; their transfer ids."""
        with self._lock:
            stale = [k for k, (at, _) in self._held.items() if now - at > self.unclaimed_s]
            for k in stale:
                del self._held[k]
        for k in stale:
            log.warning("KV transfer %r was never pulled; dropped", k)
        return stale


class Peer:
    """A link to one prefill instance (``engine_id`` names its incarnation), used by one pull at a time."""

    def __init__(self, link: KVLink, engine_id: str):
        self.link, self.engine_id, self.lock, self.broken = link, engine_id, threading.Lock(), False


class KVPuller:
    """Pulls caches for this decode instance (``identity``, named ``name`` to its peers)."""

    def __init__(
        self,
        identity: Identity,
        secret: str | None,
        max_tokens: int,
        name: str,
        dial_timeout_s: float = 10.0,
        op_timeout_s: float = 120.0,
    ):
        self.identity, self.secret, self.max_tokens, self.name = identity, secret, max_tokens, name
        self.dial_timeout_s, self.op_timeout_s = dial_timeout_s, op_timeout_s
        self.peers: dict[tuple[str, int], Peer] = {}
        self._lock = threading.Lock()
        self._dialing: dict[tuple[str, int], threading.Lock] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(64, thread_name_prefix="hetero-kv-pull")

    async def pull(self, host: str, port: int, engine_id: str, transfer_id: str) -> SequenceCache:
        """The cache ``transfer_id`` from the prefill instance ``engine_id`` at ``host:port``. Raises
        ``KVLinkRefused`` when the two refuse each other, ``LookupError`` when it holds no such
        transfer, ``ValueError`` when the cache does not fit this instance, and ``ConnectionError``
        when the link failed (this pull only: the next one dials again)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._pull, host, port, engine_id, transfer_id)

    def _peer(self, host: str, port: int, engine_id: str) -> Peer:
        key = (host, port)
        with self._lock:
            gate = self._dialing.setdefault(key, threading.Lock())
        with gate:
            peer = self.peers.get(key)
            if peer is not None and not peer.broken and peer.engine_id == engine_id:
                return peer
            timeouts = (self.dial_timeout_s, self.op_timeout_s)
            fresh = Peer(*dial(host, port, self.identity, self.secret, self.name, *timeouts))
            if peer is not None and not peer.broken and fresh.engine_id == peer.engine_id:
                fresh.link.close()  # the kept link is to the live process; the request names an older one
                return peer
            if peer is not None:  # broken, or its prefill instance restarted since
                peer.link.close()
            self.peers[key] = fresh
            return fresh

    def _pull(self, host: str, port: int, engine_id: str, transfer_id: str) -> SequenceCache:
        peer = self._peer(host, port, engine_id)
        if peer.engine_id != engine_id:
            raise LookupError(
                f"the prefill instance at {host}:{port} is engine {peer.engine_id}, not {engine_id}: it restarted "
                f"and lost transfer {transfer_id!r}"
            )
        with peer.lock:
            try:
                peer.link.ask(transfer_id)
                header = peer.link.recv_header()
                if "missing" in header:
                    raise LookupError(str(header["missing"]))
                return self._assemble(peer.link, header)
            except (LookupError, ValueError):
                raise
            except Exception as e:  # noqa: BLE001  (the link failed: this pull fails, the next dials again)
                peer.broken = True
                peer.link.close()
                raise ConnectionError(f"the KV link to the prefill instance at {host}:{port} failed: {e}") from None

    def _assemble(self, link: KVLink, header: dict) -> SequenceCache:
        """The transfer's cache; every payload is received even when it is refused, so the link stays in step."""
        try:
            assembly: Assembly | None = Assembly(header, self.identity, self.max_tokens)
            problem: Exception | None = None
        except ValueError as e:
            assembly, problem = None, e
        for index, data in enumerate(link.recv_payloads(header, window=4 if assembly else 1)):
            if assembly is not None:
                try:
                    assembly.take(index, data)
                except Exception as e:  # noqa: BLE001  (this transfer is lost, the link is not)
                    assembly, problem = None, ValueError(f"KV transfer {header.get('transfer_id')!r}: {e}")
        if assembly is None:
            raise problem
        return assembly.result()

    def close(self) -> None:
        """Close every link (before the process exits: gloo groups alive at exit abort it)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        for peer in list(self.peers.values()):
            peer.link.close()
        self.peers.clear()
