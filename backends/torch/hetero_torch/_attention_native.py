"""paged_attention and write_kv for CPU float32 and bfloat16 through hetero-torch's native kernels
(``csrc/paged_attention.cpp``, part of ``_native``'s extension).

The keys are read in place through the block table, so a step neither gathers the cache into a
padded copy nor reads the metadata on the host; the kernel clamps the metadata's values into its
tensors (the registry checks them when validation is on). The ops are ``torch.ops.hetero_torch_native``
ops with fake kernels, so torch.compile keeps them in its graph; where the extension is off or
missing, or the tensors are not all float32 or all bfloat16 on the CPU, the callers keep torch's
operators. In bfloat16 the kernel widens each row as it reads it and keeps scores, softmax and the
weighted sum in float32 (the torch path's precision), rounding the output once.
"""

from __future__ import annotations

import functools

import torch

from hetero.spec.types import AttentionMeta
from hetero_torch._native import DTYPES, extension
from hetero_torch._native import rows as _rows
from hetero_torch._traced import constant_when_traced

__all__ = ["applies", "index_of", "paged_attention", "write_kv"]


@functools.cache
def _registered() -> bool:
    """Whether the ``hetero_torch_native`` ops are loaded (the extension built) and their fake kernels registered."""
    module, _ = extension()
    if module is None:
        return False

    @torch.library.register_fake("hetero_torch_native::paged_attention")
    def _(
        query,
        k_cache,
        v_cache,
        query_start_loc,
        seq_lens,
        block_table,
        scale,
        causal,
        window_left,
        window_right,
        softcap,
        sinks,
        need_lse,
    ):
        t, h = query.shape[:2]
        return query.new_empty(t, h, v_cache.shape[3]), query.new_empty((t, h) if need_lse else (0,))

    @torch.library.register_fake("hetero_torch_native::write_kv")
    def _(key, value, k_cache, v_cache, slot_mapping):
        return None

    return True


def applies(
    k_cache: torch.Tensor, v_cache: torch.Tensor, *others: torch.Tensor | None, sinks: torch.Tensor | None = None
) -> bool:
    """Whether the native kernels take these tensors: all of one of ``DTYPES`` (sinks: any float
    dtype, read as float32) on the CPU without autograd, the caches contiguous (they are read and
    written in place), and the extension built."""
    given = [k_cache, v_cache, *(t for t in others if t is not None)]
    return (
        k_cache.dtype in DTYPES
        and all(t.device.type == "cpu" and t.dtype == k_cache.dtype and not t.requires_grad for t in given)
        and (sinks is None or (sinks.device.type == "cpu" and not sinks.requires_grad))
        and k_cache.is_contiguous()
        and v_cache.is_contiguous()
        and _built()
    )


# traced, the answer is a constant of the graph: the build is read once, not traced into
@constant_when_traced
def _built() -> bool:
    return _registered()


def _index(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.int32).contiguous()


def index_of(meta: AttentionMeta) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(query_start_loc, seq_lens, block_table) as the kernel reads them: int32, rows contiguous."""
    table = meta.block_table.to(torch.int32)
    table = table if table.shape[1] <= 1 or table.stride(1) == 1 else table.contiguous()
    return _index(meta.query_start_loc), _index(meta.seq_lens), table


def paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMeta | tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    res: torch.Tensor,
    *,
    scale: float,
    causal: bool,
    window: tuple[int, int],
    softcap: float,
    sinks: torch.Tensor | None,
    return_lse: bool,
):
    """The op's result written into res [T, Hq, Dv] (and lse float32 [T, Hq]) for inputs ``applies`` takes;
    ``meta`` may be the step plan's int32 (query_start_loc, seq_lens, block_table), as the kernel reads them."""
    if isinstance(meta, AttentionMeta):
        meta = index_of(meta)
    out, lse = torch.ops.hetero_torch_native.paged_attention(
        _rows(query),
        k_cache,
        v_cache,
        *meta,
        scale,
        causal,
        window[0],
        window[1],
        softcap,
        None if sinks is None else sinks.to(torch.float32).contiguous(),
        return_lse,
    )
    res.copy_(out)
    return (res, lse) if return_lse else res


def write_kv(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """write_kv's scatter for inputs ``applies`` takes."""
    torch.ops.hetero_torch_native.write_kv(_rows(key), _rows(value), k_cache, v_cache, slot_mapping.contiguous())
