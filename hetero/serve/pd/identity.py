"""What a prefill and a decode instance must agree on before one's KV cache is valid in the other.

Two things: the model (``fingerprint``: config.json, every safetensors header, and bytes sampled
from every tensor) and the cache layout (every paged entry's per-token shape and dtype, every
state entry's shape and dtype). The backend, the chip and the block size may differ: the cache
travels token-major, written into the importer's own blocks.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import asdict, dataclass
from pathlib import Path

from hetero.engine import LLM
from hetero.engine.runtime.cache_io import whole_shape
from hetero.errors import UsageError

__all__ = ["WIRE_VERSION", "Identity", "fingerprint", "refusal"]

#: the version of the transfer's framing (``wire.py``); instances of different versions refuse each other
WIRE_VERSION = 2

_SAMPLE = 64  # bytes hashed at the start, middle and end of every tensor


def fingerprint(model_dir: str | Path) -> str:
    """A hash of a checkpoint: config.json, the safetensors headers (names, dtypes, shapes, offsets) and
    ``_SAMPLE`` bytes at the start, middle and end of every tensor's data.

    Two checkpoints of one architecture with different weights differ in the sampled bytes; the
    whole weights are not read, so a change confined to the unsampled bytes of every tensor goes
    unseen."""
    root = Path(model_dir)
    h = hashlib.sha256(json.dumps(json.loads((root / "config.json").read_text()), sort_keys=True).encode())
    for path in sorted(root.glob("*.safetensors")):
        h.update(path.name.encode())
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = f.read(size)
            h.update(header)
            for name, info in sorted(json.loads(header).items()):
                if name == "__metadata__":
                    continue
                start, end = info["data_offsets"]
                for at in sorted({start, max(start, (start + end - _SAMPLE) // 2), max(start, end - _SAMPLE)}):
                    f.seek(8 + size + at)
                    h.update(f.read(min(_SAMPLE, end - at)))
    return h.hexdigest()[:32]


@dataclass(frozen=True)
class Identity:
    """One side of a KV link: its role, model directory, fingerprint and cache layout.

    ``paged`` / ``state``: ``[name, dtype, shape]`` per entry, sorted by name; a paged entry's
    shape is per token, a state entry's per sequence, each with every head (under tensor parallelism a
    cache is gathered on export and cut on import, so instances of any ``tp`` sizes pair up, and a layer
    whose shard is not declared shows as a shape that differs)."""

    role: str
    model: str
    fingerprint: str
    paged: tuple[tuple[str, str, tuple[int, ...]], ...]
    state: tuple[tuple[str, str, tuple[int, ...]], ...]
    wire: int = WIRE_VERSION
    tp: int = 1

    @classmethod
    def of(cls, llm: LLM, role: str) -> "Identity":
        pools = llm.runner.cache
        if getattr(pools, "tokens_per_slot", None):  # the wire moves one row per token per paged entry
            raise UsageError(
                "prefill/decode disaggregation does not move caches with compressed entries (DeepSeek-V4) yet",
                arg="model",
                expected="a model whose paged cache entries are all per token",
                got=", ".join(pools.tokens_per_slot),
            )
        whole = lambda n, t, lead: (n, str(t.dtype), whole_shape(pools, n, t.shape[lead:]))  # noqa: E731
        paged = tuple(whole(n, t, 2) for n, t in sorted(pools.paged.items()))
        state = tuple(whole(n, t, 1) for n, t in sorted(pools.state.items()))
        model = str(Path(llm.config.model).resolve())
        return cls(role, model, fingerprint(llm.config.model), paged, state, tp=llm.runner.parallel.size)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "Identity":
        d = json.loads(data)
        entries = lambda key: tuple((n, dt, tuple(shape)) for n, dt, shape in d[key])  # noqa: E731
        wire, tp = d.get("wire", 0), d.get("tp", 1)
        return cls(d["role"], d["model"], d["fingerprint"], entries("paged"), entries("state"), wire, tp)


def refusal(mine: Identity, theirs: Identity) -> str | None:
    """Why ``theirs``' caches are not valid here (None: they are), in words an operator can act on."""
    peer = f"the {theirs.role} instance ({theirs.model})"
    here = f"this {mine.role} instance ({mine.model})"
    if theirs.wire != mine.wire:
        return f"{peer} speaks KV transfer version {theirs.wire}, {here} version {mine.wire}: run one hetero version"
    if theirs.fingerprint != mine.fingerprint:
        return (
            f"{peer} serves another model than {here}: fingerprints {theirs.fingerprint} and "
            f"{mine.fingerprint} (config.json, safetensors headers or weights differ); a KV cache is only "
            f"valid for the weights that computed it"
        )
    for kind in ("paged", "state"):
        ours, peers = (
            dict((n, (dt, s)) for n, dt, s in getattr(mine, kind)),
            dict((n, (dt, s)) for n, dt, s in getattr(theirs, kind)),
        )
        if set(ours) != set(peers):
            odd = sorted(set(ours) ^ set(peers))
            return f"{peer} and {here} hold different {kind} cache entries (not in both: {odd[:4]})"
        for name, (dt, shape) in sorted(ours.items()):
            if peers[name] != (dt, shape):
                return (
                    f"{kind} cache entry '{name}': {peer} holds {peers[name][0]} {list(peers[name][1])}, "
                    f"{here} {dt} {list(shape)}; serve both with the same --dtype"
                )
    return None
