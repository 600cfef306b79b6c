"""``KVLink``: the torch.distributed link between one prefill and one decode instance.

A ``TCPStore`` hosted by the decode instance is the rendezvous; over it the two sides swap their
``Identity`` and refuse each other when the model or the cache layout differs, before any cache
moves. Then two gloo process groups of two ranks (prefill 0, decode 1) carry the transfers:

- ``ctrl`` carries one int64 per transfer, the header's length. The decode side always has a
  receive posted on it, so its timeout is long: a gloo receive that times out closes the pair.
- ``data`` carries the header and the payloads (``wire.py``), only once ``ctrl`` announced them,
  under the operation timeout.

Why gloo point-to-point: it is torch.distributed's CPU transport, present wherever torch is,
and the cache is exported to CPU memory anyway (``SequenceCache``), so the two chips need no
common device runtime. A device-to-device transport (NCCL, HCCL, NIXL) would skip that copy.
"""

from __future__ import annotations

import collections
import datetime
import gc
import socket
import time
from typing import Iterator

import torch
from torch.distributed import PrefixStore, ProcessGroupGloo, TCPStore

from hetero.errors import UsageError
from hetero.serve.pd.identity import Identity, refusal
from hetero.serve.pd.wire import MAX_HEADER_BYTES, Header, decode_header, encode_header, sizes

__all__ = ["KVLink", "KVLinkRefused", "connect", "parse_addr"]

PREFILL, DECODE = 0, 1
_IDLE = datetime.timedelta(days=365)


class KVLinkRefused(UsageError):
    """The peer's model or cache layout is not this instance's."""


def parse_addr(addr: str) -> tuple[str, int]:
    """``HOST:PORT`` (``--kv-transfer-addr``)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(
            f"argument '--kv-transfer-addr': expected HOST:PORT, got {addr!r}",
            arg="--kv-transfer-addr",
            expected="HOST:PORT",
            got=addr,
        )
    return host, int(port)


class KVLink:
    """The two groups of a connected link and the peer's identity; ``send`` on the prefill side,
    ``recv`` on the decode side, each from one thread."""

    def __init__(self, store: TCPStore, rank: int, identity: Identity, peer: Identity, timeout: datetime.timedelta):
        self.store, self.rank, self.identity, self.peer, self.timeout = store, rank, identity, peer, timeout
        self._ctrl = ProcessGroupGloo(PrefixStore("ctrl", store), rank, 2, _IDLE)
        self._data = ProcessGroupGloo(PrefixStore("data", store), rank, 2, timeout)

    def send(self, header: Header, payloads: Iterator[torch.Tensor]) -> int:
        """Announce ``header`` and send it and its payloads; the bytes sent. Every send is posted
        before any is waited on, so the transfer costs one hand-off, not one per payload; each is
        waited on for the operation timeout at most (a peer that stopped receiving breaks the link)."""
        data = encode_header(header)
        length = torch.tensor([data.numel()], dtype=torch.int64)
        tensors = [data, *payloads]
        works = [self._ctrl.send([length], 1 - self.rank, 0)]
        works += [self._data.send([t], 1 - self.rank, 0) for t in tensors]
        for work in works:
            work.wait(self.timeout)
        return sum(t.numel() for t in tensors)

    def close(self) -> None:
        """Drop both groups, which closes their connections: a peer blocked on this side learns at
        once that the link is gone (``abort`` alone leaves the peer to its timeout, measured)."""
        for group in (self._ctrl, self._data):
            if group is not None:
                try:
                    group.abort()
                except Exception:  # noqa: BLE001  (a group that already broke)
                    pass
        self._ctrl = self._data = None
        gc.collect()

    def recv_header(self) -> Header:
        """Wait for the next transfer (as long as it takes) and take its header."""
        length = torch.empty(1, dtype=torch.int64)
        self._ctrl.recv([length], 1 - self.rank, 0).wait()
        n = int(length.item())
        if not 0 < n <= MAX_HEADER_BYTES:
            raise RuntimeError(f"the peer announced a KV transfer header of {n} bytes (at most {MAX_HEADER_BYTES})")
        data = torch.empty(n, dtype=torch.uint8)
        self._data.recv([data], 1 - self.rank, 0).wait()
        return decode_header(data)

    def recv_payloads(self, header: Header, window: int = 4) -> Iterator[torch.Tensor]:
        """The payloads after ``header``, uint8 tensors of the sizes it claims, in order. Up to
        ``window`` receives are posted ahead, so few hand-offs are needed and little memory waits."""
        pending: collections.deque = collections.deque()
        for size in sizes(header):
            buf = torch.empty(size, dtype=torch.uint8)
            pending.append((buf, self._data.recv([buf], 1 - self.rank, 0)))
            if len(pending) >= window:
                yield _done(*pending.popleft())
        while pending:
            yield _done(*pending.popleft())


def _done(buf: torch.Tensor, work) -> torch.Tensor:
    work.wait()
    return buf


def connect(role: str, addr: str, identity: Identity, timeout_s: float, op_timeout_s: float = 120.0) -> KVLink:
    """Join the link at ``addr``: the decode instance hosts the store there, the prefill instance
    connects to it; each waits up to ``timeout_s`` for the other. Raises ``KVLinkRefused`` when the
    peer's identity does not match, ``TimeoutError`` when no peer came."""
    host, port = parse_addr(addr)
    rank = DECODE if role == "decode" else PREFILL
    deadline = time.monotonic() + timeout_s
    other = "prefill" if rank == DECODE else "decode"
    late = TimeoutError(f"--role {role}: no {other} instance met this one at {host}:{port} within {timeout_s:g} s")
    if rank == PREFILL and not _listening(host, port, deadline):
        raise late
    store = TCPStore(
        host,
        port,
        2,
        is_master=rank == DECODE,
        timeout=datetime.timedelta(seconds=max(timeout_s, 1)),
        wait_for_workers=False,
    )
    peer = _swap(store, rank, identity, deadline)
    if peer is None:
        raise late
    reason = refusal(identity, peer)
    if reason is not None:
        raise KVLinkRefused(f"--role {role}: the KV link at {host}:{port} refused: {reason}")
    return KVLink(store, rank, identity, peer, datetime.timedelta(seconds=op_timeout_s))


def _listening(host: str, port: int, deadline: float) -> bool:
    """Wait for the decode instance's store to accept (quietly: the store's own retries log each try)."""
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)


def _swap(store: TCPStore, rank: int, identity: Identity, deadline: float) -> Identity | None:
    """Exchange identities (None: the peer's never came). The prefill side reads the decode's before it
    writes its own, so by the time the decode side (which hosts the store) can refuse and exit, both
    have read both."""
    mine, theirs = (
        ("identity/decode", "identity/prefill") if rank == DECODE else ("identity/prefill", "identity/decode")
    )
    if rank == DECODE:
        store.set(mine, identity.to_json())
    while not store.check([theirs]):
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)
    peer = Identity.from_json(store.get(theirs))
    if rank == PREFILL:
        store.set(mine, identity.to_json())
    return peer
