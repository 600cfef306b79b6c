"""How a decode instance and a prefill instance meet: ``KVServer`` on the prefill side hosts a
``TCPStore`` at ``--kv-transfer-addr`` and accepts any number of decode instances, each of which
``dial``s it the first time a request names it. Over the store, per pair:

1. the decode side takes a pair number and writes ``hello``: its identity, name and a nonce;
2. the prefill side answers ``welcome``: its identity, engine id, a nonce, and its proof, an
   HMAC-SHA256 of both nonces under the link's secret;
3. the decode side checks the identity and the proof, and answers ``proof`` with its own HMAC;
4. the prefill side checks both and writes ``verdict``: ``ok``, or why it refuses.

The secret itself never crosses the wire, and a proof is good for one pair only. A refused peer is
logged by name on the prefill side and told why; both go on serving. Then the pair builds its
``KVLink`` under the pair's prefix of the store.
"""

from __future__ import annotations

import collections
import datetime
import hashlib
import hmac
import json
import logging
import secrets
import socket
import threading
import time
import uuid
from typing import Callable

from torch.distributed import PrefixStore, TCPStore

from hetero.serve.pd.identity import Identity, refusal
from hetero.serve.pd.link import DECODE, PREFILL, KVLink, KVLinkRefused, parse_addr

__all__ = ["KVServer", "dial"]

log = logging.getLogger("hetero.serve")
_OK = "ok"


def _proof(secret: str | None, role: str, pair: str, theirs: str, mine: str) -> str:
    message = f"hetero-kv-link|{role}|{pair}|{theirs}|{mine}".encode()
    return hmac.new((secret or "").encode(), message, hashlib.sha256).hexdigest()


def _same(a: str, b: str) -> bool:
    """Constant-time equality of two proofs (bytes: ``compare_digest`` refuses non-ASCII text)."""
    return hmac.compare_digest(a.encode(errors="replace"), b.encode())


def _wait(store: TCPStore, key: str, deadline: float, closed: Callable[[], bool] = lambda: False) -> bytes | None:
    while not store.check([key]):
        if time.monotonic() > deadline or closed():
            return None
        time.sleep(0.02)
    return store.get(key)


class KVServer:
    """The prefill instance's end of its links: the store at ``addr``, and a thread per pair that
    runs the handshake, then calls ``serve(link)`` (which returns when the link is done)."""

    def __init__(
        self,
        addr: str,
        identity: Identity,
        secret: str | None,
        serve: Callable[[KVLink], None],
        handshake_s: float = 30.0,
        op_timeout_s: float = 120.0,
    ):
        host, self.port = parse_addr(addr)
        anywhere = host in ("0.0.0.0", "::", "*")
        self.host = socket.getfqdn() if anywhere else host
        self._local = "127.0.0.1" if anywhere else host
        self.identity, self.secret, self.serve = identity, secret, serve
        self.handshake_s, self.op_timeout = handshake_s, datetime.timedelta(seconds=op_timeout_s)
        self.engine_id = uuid.uuid4().hex
        self.refused: collections.deque[str] = collections.deque(maxlen=100)  # why peers were refused, newest last
        self.error: BaseException | None = None
        self.closed = False
        self.store = TCPStore(host, self.port, None, True, datetime.timedelta(seconds=30), wait_for_workers=False)
        self.store.set("kv/engine", self.engine_id)
        threading.Thread(target=self._accept, name="hetero-kv-server", daemon=True).start()

    def close(self) -> None:
        """Stop accepting (the links already made end with their peers)."""
        self.closed = True

    def _accept(self) -> None:
        seen = 0
        try:
            while not self.closed:
                count = self.store.add("kv/pairs", 0)
                for k in range(seen + 1, count + 1):
                    threading.Thread(target=self._pair, args=(str(k),), name=f"hetero-kv-pair-{k}", daemon=True).start()
                seen = count
                time.sleep(0.05)
        except Exception as e:  # noqa: BLE001  (the store is gone: /health says so)
            self.error = e
            log.error("KV server at %s:%s failed: %s", self.host, self.port, e)

    def _pair(self, pair: str) -> None:
        # a client of its own: a store call that waits (gloo's set-up does) holds its client, not every pair's
        client = TCPStore(self._local, self.port, None, False, datetime.timedelta(seconds=self.handshake_s))
        store = PrefixStore(f"kv/{pair}", client)
        deadline = time.monotonic() + self.handshake_s
        try:
            hello = _wait(store, "hello", deadline, lambda: self.closed)
            if hello is None:
                return
            hello = json.loads(hello)
            name, nonce, peer = str(hello["name"]), str(hello["nonce"]), Identity.from_json(hello["identity"].encode())
        except Exception as e:  # noqa: BLE001  (a stranger that does not speak the protocol)
            self._refuse(store, f"pair {pair}", f"its hello does not parse: {e}")
            return
        mine = secrets.token_hex(16)
        welcome = {"identity": self.identity.to_json().decode(), "engine_id": self.engine_id, "nonce": mine}
        welcome["proof"] = _proof(self.secret, "prefill", pair, nonce, mine)
        store.set("welcome", json.dumps(welcome))
        answer = _wait(store, "proof", deadline, lambda: self.closed)
        if answer is None:
            self._refuse(store, name, "it never answered the challenge")
            return
        try:
            answer = json.loads(answer)
            proof, their_refusal = str(answer["proof"]), answer.get("refused")
        except Exception as e:  # noqa: BLE001
            self._refuse(store, name, f"its answer does not parse: {e}")
            return
        if their_refusal:
            self._refuse(store, name, f"it refused this instance: {their_refusal}")
            return
        if not _same(proof, _proof(self.secret, "decode", pair, mine, nonce)):
            self._refuse(store, name, "it does not hold this link's secret (--kv-link-secret)")
            return
        reason = refusal(self.identity, peer)
        if reason is not None:
            self._refuse(store, name, reason)
            return
        store.set("verdict", _OK)
        try:
            link = KVLink(store, PREFILL, self.identity, peer, self.op_timeout)
        except Exception as e:  # noqa: BLE001  (the peer left during the set-up)
            log.warning("KV link with decode instance %r was not set up: %s", name, e)
            return
        log.info("KV link up with decode instance %r", name)
        link.peer_name = name
        self.serve(link)

    def _refuse(self, store: PrefixStore, name: str, reason: str) -> None:
        self.refused.append(f"{name}: {reason}")
        log.warning("refused the KV link of decode instance %r: %s", name, reason)
        store.set("verdict", reason)


def dial(
    host: str,
    port: int,
    identity: Identity,
    secret: str | None,
    name: str,
    timeout_s: float = 10.0,
    op_timeout_s: float = 120.0,
) -> tuple[KVLink, str]:
    """Link this decode instance to the prefill instance's ``KVServer`` at ``host:port``; the link
    and the server's engine id. Raises ``KVLinkRefused`` when either side refuses the other,
    ``ConnectionError`` when nothing answers within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    where = f"the prefill instance at {host}:{port}"
    if not _listening(host, port, deadline):
        raise ConnectionError(f"{where} does not accept KV links (nothing listens there)")
    base = TCPStore(host, port, None, False, datetime.timedelta(seconds=max(timeout_s, 1)), wait_for_workers=False)
    pair = str(base.add("kv/pairs", 1))
    store = PrefixStore(f"kv/{pair}", base)
    mine = secrets.token_hex(16)
    store.set("hello", json.dumps({"name": name, "nonce": mine, "identity": identity.to_json().decode()}))
    welcome = _wait(store, "welcome", deadline)
    if welcome is None:
        verdict = store.get("verdict").decode() if store.check(["verdict"]) else "it never answered"
        raise ConnectionError(f"{where} did not take the KV link: {verdict}")
    welcome = json.loads(welcome)
    peer, theirs = Identity.from_json(welcome["identity"].encode()), str(welcome["nonce"])
    reason = refusal(identity, peer)
    if reason is None and not _same(str(welcome["proof"]), _proof(secret, "prefill", pair, mine, theirs)):
        reason = "it does not hold this link's secret (--kv-link-secret)"
    proof = _proof(secret, "decode", pair, theirs, mine) if reason is None else ""
    store.set("proof", json.dumps({"proof": proof, "refused": reason}))
    verdict = _wait(store, "verdict", deadline)  # when refusing too: the prefill side has logged it when we return
    if reason is not None:
        raise KVLinkRefused(f"the KV link to {where} refused: {reason}")
    if verdict != _OK.encode():
        why = verdict.decode() if verdict is not None else "no verdict in time"
        raise KVLinkRefused(f"{where} refused this instance's KV link: {why}")
    return KVLink(store, DECODE, identity, peer, datetime.timedelta(seconds=op_timeout_s)), str(welcome["engine_id"])


def _listening(host: str, port: int, deadline: float) -> bool:
    """Whether the server accepts (quietly: the store's own retries log each try)."""
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
