"""Allocate the paged KV cache of a model and bind it to its cached layers."""
from __future__ import annotations

import math

import torch

from hetero.engine.models.base import CausalLM

__all__ = ["bytes_per_block", "allocate_kv_cache"]


def bytes_per_block(model: CausalLM, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one KV block takes over all cached layers of ``model``."""
    per_token = sum(math.prod(e.shape) * (e.dtype or dtype).itemsize
                    for layer in model.cached_layers() for e in layer.cache_spec())
    return per_token * block_size


def allocate_kv_cache(model: CausalLM, num_blocks: int, block_size: int, dtype: torch.dtype,
                      device: torch.device | str) -> list[dict[str, torch.Tensor]]:
    """One ``[num_blocks, block_size, *shape]`` tensor per cache entry of every cached layer, bound to it.

    The cache is filled with NaN so that a read of a slot nobody wrote shows up in the output.
    """
    caches = []
    for layer in model.cached_layers():
        tensors = {e.name: torch.full((num_blocks, block_size, *e.shape), e.fill, dtype=e.dtype or dtype, device=device)
                   for e in layer.cache_spec()}
        layer.bind_cache(**tensors)
        caches.append(tensors)
    return caches
