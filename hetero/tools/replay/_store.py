"""Recorded op-call tensors on disk: safetensors files under a byte cap.

Each tensor is stored as its raw bytes, with its dtype and shape in the file's metadata, so
every dtype the engine uses (fp8 flavours and int8 too) round-trips bit for bit whatever
safetensors itself supports. A file is one call's tensors, or one weight that every call
using it shares.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

__all__ = ["TensorStore", "nbytes"]


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


class TensorStore:
    """A temporary directory of named safetensors files holding at most ``max_bytes`` in all.

    Callers ask ``fits`` before copying anything to the host, then ``put``; ``delete``
    gives a file's bytes back. ``close()`` (or leaving the ``with`` block) deletes the directory.
    """

    def __init__(self, max_bytes: int, root: str | Path | None = None):
        self._tmp = tempfile.TemporaryDirectory(prefix="hetero-opcalls-", dir=root)
        self.root = Path(self._tmp.name)
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._sizes: dict[str, int] = {}

    def fits(self, size: int) -> bool:
        return self.nbytes + size <= self.max_bytes

    def put(self, name: str, tensors: dict[str, torch.Tensor]) -> bool:
        """Write ``tensors`` as file ``name``; False (nothing written) when they would pass the cap."""
        size = nbytes(tensors.values())
        if not self.fits(size):
            return False
        layout = {k: [str(t.dtype).removeprefix("torch."), list(t.shape)] for k, t in tensors.items()}
        save_file(
            {k: _as_bytes(t) for k, t in tensors.items()},
            str(self._path(name)),
            metadata={"layout": json.dumps(layout)},
        )
        self.nbytes += size
        self._sizes[name] = size
        return True

    def get(self, name: str) -> dict[str, torch.Tensor]:
        from safetensors import safe_open

        path = str(self._path(name))
        with safe_open(path, framework="pt") as f:
            layout = json.loads(f.metadata()["layout"])
        raw = load_file(path)
        return {k: raw[k].view(getattr(torch, dtype)).reshape(shape) for k, (dtype, shape) in layout.items()}

    def delete(self, name: str) -> None:
        self._path(name).unlink()
        self.nbytes -= self._sizes.pop(name)

    def _path(self, name: str) -> Path:
        return self.root / f"{name}.safetensors"

    def close(self) -> None:
        self._tmp.cleanup()

    def __enter__(self) -> TensorStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
