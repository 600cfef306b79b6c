"""hetero's MLA ops as opaque ``torch.library`` custom ops: ``hetero::write_mla_kv`` and ``hetero::mla_attention``.

As in ``torch_ops``: the real implementation counts the call under ``site`` and runs
the process's hetero op table; the fake one gives shapes only. The metadata
arguments are ``hetero.AttentionMeta``'s fields, flattened.
"""

from __future__ import annotations

import torch

from hetero_vllm import _backend, report
from hetero_vllm.torch_ops import _fresh

__all__ = ["write_mla_kv", "mla_attention"]


@torch.library.custom_op("hetero::write_mla_kv", mutates_args=("ckv_cache", "kpe_cache"))
def write_mla_kv(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    ckv_cache: torch.Tensor,
    kpe_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    site: str,
) -> None:
    """hetero ``write_mla_kv``: kv_c [T, L] and k_pe [T, R] into ckv_cache [NB, BS, L] and kpe_cache [NB, BS, R]
    (strided views of one cache allowed); slot_mapping int64 [T], -1 skips a token."""
    report.record(site, "write_mla_kv")
    _backend.ops().write_mla_kv(kv_c, k_pe, ckv_cache, kpe_cache, slot_mapping)


@write_mla_kv.register_fake
def _(kv_c, k_pe, ckv_cache, kpe_cache, slot_mapping, site):
    return None


@torch.library.custom_op("hetero::mla_attention", mutates_args=())
def mla_attention(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    ckv_cache: torch.Tensor,
    kpe_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_query_len: int,
    max_seq_len: int,
    scale: float,
    causal: bool,
    site: str,
    topk_indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """hetero ``mla_attention``: q_nope [T, H, L] already absorbed by W_UK, q_pe [T, H, R] over the latent
    caches; returns out [T, H, L] in the latent space (the caller applies W_UV). ``topk_indices`` int32 [T, K]
    (sequence positions, -1 skipped): DSA's sparse attention over those positions only."""
    import hetero

    report.record(site, "mla_attention")
    meta = hetero.AttentionMeta(query_start_loc, seq_lens, block_table, max_query_len, max_seq_len)
    out = _backend.ops().mla_attention(
        q_nope, q_pe, ckv_cache, kpe_cache, meta, scale=scale, causal=causal, topk_indices=topk_indices
    )
    return _fresh(out, q_nope, q_pe, ckv_cache)


@mla_attention.register_fake
def _(
    q_nope,
    q_pe,
    ckv_cache,
    kpe_cache,
    query_start_loc,
    seq_lens,
    block_table,
    max_query_len,
    max_seq_len,
    scale,
    causal,
    site,
    topk_indices=None,
):
    return q_nope.new_empty((q_nope.shape[0], q_nope.shape[1], ckv_cache.shape[-1]))
