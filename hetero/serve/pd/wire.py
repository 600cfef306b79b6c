"""How one sequence's cache travels: a JSON header, then its tokens block by block, then its state.

The layout is hardware-neutral: plain bytes of the entries' dtype, token-major, so neither side's
block size, block ids or device is baked in. For a cache of ``n`` tokens sent in blocks of ``B``:

- header: ``{"transfer_id", "fingerprint", "num_tokens", "tokens_per_block", "token_ids", "paged",
  "state"}``, where ``paged`` / ``state`` list ``[name, dtype, shape]`` in the order the payloads use;
- one payload per block ``k`` of tokens ``[kB, min((k+1)B, n))``: every paged entry's rows for those
  tokens, entry after entry, each row-major (the sender picks ``B``: whole blocks of its own, about
  ``PAYLOAD_BYTES`` a payload);
- one payload of every state entry, entry after entry, when the model has state.
"""

from __future__ import annotations

import json
import math
from typing import Iterator

import torch

from hetero.engine.runtime.cache_io import SequenceCache
from hetero.serve.pd.identity import Identity

__all__ = [
    "Header",
    "header_of",
    "payloads",
    "encode_header",
    "decode_header",
    "sizes",
    "Assembly",
    "MAX_HEADER_BYTES",
    "tokens_per_payload",
]

#: a header longer than this is a broken peer, not a long prompt (a million token ids fit)
MAX_HEADER_BYTES = 1 << 24

Header = dict


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"KV transfer header: unknown dtype {name!r}")
    return dt


#: payloads are whole blocks of about this many bytes: few messages, and none of them huge
PAYLOAD_BYTES = 8 << 20


def _entry_bytes(entries) -> int:
    """Bytes of one of each ``[name, dtype, shape]`` entry: a token's row of paged entries, or the state."""
    return sum(math.prod(s) * _dtype(dt).itemsize for _, dt, s in entries)


def tokens_per_payload(identity: Identity, block_size: int) -> int:
    """The most whole blocks of ``block_size`` tokens that fit ``PAYLOAD_BYTES`` (at least one block)."""
    row = _entry_bytes(identity.paged) or 1
    return block_size * max(1, PAYLOAD_BYTES // (row * block_size))


def header_of(cache: SequenceCache, transfer_id: str, identity: Identity, tokens_per_block: int) -> Header:
    """The header announcing ``cache``, sent in blocks of ``tokens_per_block`` tokens."""
    return {
        "transfer_id": transfer_id,
        "fingerprint": identity.fingerprint,
        "num_tokens": cache.num_tokens,
        "tokens_per_block": tokens_per_block,
        "token_ids": list(cache.token_ids or ()),
        "paged": [[n, dt, list(s)] for n, dt, s in identity.paged],
        "state": [[n, dt, list(s)] for n, dt, s in identity.state],
    }


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8).flatten()


def payloads(cache: SequenceCache, header: Header) -> Iterator[torch.Tensor]:
    """The uint8 payloads after ``header``: one per block of tokens, then the state (if any)."""
    n, per = header["num_tokens"], header["tokens_per_block"]
    for start in range(0, n, per):
        rows = [_bytes(cache.paged[name][start : start + per]) for name, _, _ in header["paged"]]
        yield torch.cat(rows) if rows else torch.empty(0, dtype=torch.uint8)
    if header["state"]:
        yield torch.cat([_bytes(cache.state[name]) for name, _, _ in header["state"]])


def encode_header(header: Header) -> torch.Tensor:
    return torch.frombuffer(bytearray(json.dumps(header).encode()), dtype=torch.uint8)


def decode_header(data: torch.Tensor) -> Header:
    return json.loads(bytes(data.numpy()))


def sizes(header: Header) -> list[int]:
    """Bytes of each payload after ``header``, from its own claims (ValueError when they do not parse)."""
    try:
        n, per = int(header["num_tokens"]), int(header["tokens_per_block"])
        row, state = _entry_bytes(header["paged"]), _entry_bytes(header["state"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"KV transfer header does not parse: {e}") from None
    if per < 1 or n < 0:
        raise ValueError(f"KV transfer header: num_tokens {n} and tokens_per_block {per} make no blocks")
    return [min(per, n - start) * row for start in range(0, n, per)] + ([state] if header["state"] else [])


class Assembly:
    """The receiving side of one transfer: checks the header against this instance's identity, then
    takes the payloads in order (``sizes(header)`` bytes each) into a ``SequenceCache``."""

    def __init__(self, header: Header, identity: Identity, max_tokens: int):
        self.header = header
        problem = _check(header, identity, max_tokens)
        if problem:
            raise ValueError(f"KV transfer {header.get('transfer_id')!r} refused: {problem}")
        n = header["num_tokens"]
        self.paged = [(name, torch.empty((n, *s), dtype=_dtype(dt))) for name, dt, s in header["paged"]]
        self.state = [(name, torch.empty(tuple(s), dtype=_dtype(dt))) for name, dt, s in header["state"]]

    def take(self, index: int, data: torch.Tensor) -> None:
        """Payload ``index`` (uint8) into its place."""
        n, per = self.header["num_tokens"], self.header["tokens_per_block"]
        targets = (
            [t[index * per : (index + 1) * per] for _, t in self.paged]
            if index * per < n
            else [t for _, t in self.state]
        )
        at = 0
        for t in targets:
            _bytes(t).copy_(data[at : at + t.nbytes])
            at += t.nbytes

    def result(self) -> SequenceCache:
        return SequenceCache(
            self.header["num_tokens"], dict(self.paged), dict(self.state), list(self.header["token_ids"])
        )


def _check(header: Header, identity: Identity, max_tokens: int) -> str | None:
    n, per = header.get("num_tokens"), header.get("tokens_per_block")
    if header.get("fingerprint") != identity.fingerprint:
        return (
            f"it comes from model fingerprint {header.get('fingerprint')}, this instance serves {identity.fingerprint}"
        )
    if not isinstance(n, int) or not 0 < n <= max_tokens:
        return f"num_tokens must be an integer in [1, {max_tokens}], got {n!r}"
    if not isinstance(per, int) or per < 1:
        return f"tokens_per_block must be a positive integer, got {per!r}"
    if len(header.get("token_ids", ())) != n:
        return f"it carries {len(header.get('token_ids', ()))} token ids for {n} tokens"
    for kind in ("paged", "state"):
        want = [[name, dt, list(s)] for name, dt, s in getattr(identity, kind)]
        if header.get(kind) != want:
            return (
                f"its {kind} entries are not this instance's: expected {_short(want)}, got {_short(header.get(kind))}"
            )
    return None


def _short(entries) -> str:
    text = json.dumps(entries)
    return text if len(text) < 200 else text[:200] + "..."
