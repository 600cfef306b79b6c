"""Recorded op-call tensors on disk: one safetensors file per call, under a byte cap.

Each tensor is stored as its raw bytes, with its dtype and shape in the file's metadata, so
every dtype the engine uses (fp8 flavours and int8 too) round-trips bit for bit whatever
safetensors itself supports.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

__all__ = ["TensorStore"]


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


class TensorStore:
    """A temporary directory of ``call-<n>.safetensors`` files holding at most ``max_bytes`` in all.

    ``put`` refuses (returns False) a call whose tensors would pass the cap; nothing is
    written for it. ``close()`` (or leaving the ``with`` block) deletes the directory.
    """

    def __init__(self, max_bytes: int, root: str | Path | None = None):
        self._tmp = tempfile.TemporaryDirectory(prefix="hetero-opcalls-", dir=root)
        self.root = Path(self._tmp.name)
        self.max_bytes = max_bytes
        self.nbytes = 0

    def put(self, index: int, tensors: dict[str, torch.Tensor]) -> bool:
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        if self.nbytes + size > self.max_bytes:
            return False
        layout = {k: [str(t.dtype).removeprefix("torch."), list(t.shape)] for k, t in tensors.items()}
        save_file({k: _as_bytes(t) for k, t in tensors.items()}, str(self._path(index)),
                  metadata={"layout": json.dumps(layout)})
        self.nbytes += size
        return True

    def get(self, index: int) -> dict[str, torch.Tensor]:
        from safetensors import safe_open

        path = str(self._path(index))
        with safe_open(path, framework="pt") as f:
            layout = json.loads(f.metadata()["layout"])
        raw = load_file(path)
        return {k: raw[k].view(getattr(torch, dtype)).reshape(shape) for k, (dtype, shape) in layout.items()}

    def _path(self, index: int) -> Path:
        return self.root / f"call-{index:06d}.safetensors"

    def close(self) -> None:
        self._tmp.cleanup()

    def __enter__(self) -> TensorStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
