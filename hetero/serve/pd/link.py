"""``KVLink``: the torch.distributed link between one prefill and one decode instance.

The decode instance dials the prefill instance's ``KVServer`` (``rendezvous``); over the server's
``TCPStore`` the two prove the shared secret and swap their ``Identity`` before any cache moves.
Then two gloo process groups of two ranks (prefill 0, decode 1) carry the transfers, pulled by the
decode side one at a time:

- ``ctrl`` carries the decode side's requests (a transfer id) and, back, one int64 per answer, its
  header's length. The prefill side always has a receive posted on it, so its timeout is long: a
  gloo receive that times out closes the pair.
- ``data`` carries the header and the payloads (``wire.py``) under the operation timeout.

Why gloo point-to-point: it is torch.distributed's CPU transport, present wherever torch is,
and the cache is exported to CPU memory anyway (``SequenceCache``), so the two chips need no
common device runtime. A device-to-device transport (NCCL, HCCL, NIXL) would skip that copy.
"""

from __future__ import annotations

import collections
import datetime
import gc
from typing import Iterator

import torch
from torch.distributed import ProcessGroupGloo, Store

from hetero.errors import UsageError
from hetero.serve.pd.identity import Identity
from hetero.serve.pd.wire import MAX_HEADER_BYTES, Header, decode_header, encode_header, sizes

__all__ = ["KVLink", "KVLinkRefused", "parse_addr"]

PREFILL, DECODE = 0, 1
IDLE = datetime.timedelta(days=365)
_ASK_BYTES = 128  # a request: the transfer id, utf-8, zero-padded


class KVLinkRefused(UsageError):
    """The peer's model or cache layout is not this instance's, or it does not hold the link's secret."""


def parse_addr(addr: str, arg: str = "--kv-transfer-addr") -> tuple[str, int]:
    """``HOST:PORT``."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"argument '{arg}': expected HOST:PORT, got {addr!r}", arg=arg, expected="HOST:PORT", got=addr)
    return host, int(port)


class KVLink:
    """The two groups of a connected link and the peer's identity: on the prefill side
    ``next_request`` then ``send``, on the decode side ``ask`` then ``recv_header`` and
    ``recv_payloads``, each side from one thread at a time. ``store`` is kept for the link's life."""

    def __init__(self, store: Store, rank: int, identity: Identity, peer: Identity, timeout: datetime.timedelta):
        from torch.distributed import PrefixStore

        self.store, self.rank, self.identity, self.peer, self.timeout = store, rank, identity, peer, timeout
        self.peer_name = peer.role
        self._ctrl = ProcessGroupGloo(PrefixStore("ctrl", store), rank, 2, IDLE)
        self._data = ProcessGroupGloo(PrefixStore("data", store), rank, 2, timeout)

    def ask(self, transfer_id: str) -> None:
        """Decode side: request the transfer ``transfer_id``."""
        data = transfer_id.encode()
        if not 0 < len(data) <= _ASK_BYTES:
            raise ValueError(f"a KV transfer id is 1 to {_ASK_BYTES} bytes, got {len(data)}")
        buf = torch.zeros(_ASK_BYTES, dtype=torch.uint8)
        buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        self._ctrl.send([buf], 1 - self.rank, 1).wait(self.timeout)

    def next_request(self) -> str:
        """Prefill side: wait (as long as it takes) for the peer's next request; its transfer id."""
        buf = torch.empty(_ASK_BYTES, dtype=torch.uint8)
        self._ctrl.recv([buf], 1 - self.rank, 1).wait()
        return bytes(buf.numpy()).rstrip(b"\0").decode(errors="replace")

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
        """The header answering the last ``ask`` (within the operation timeout)."""
        length = torch.empty(1, dtype=torch.int64)
        self._ctrl.recv([length], 1 - self.rank, 0).wait(self.timeout)
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
