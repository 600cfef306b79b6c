"""DSA (DeepSeek-V3.2 / GLM-5) on torch_npu: hetero's indexer_topk and sparse mla_attention arguments
as npu_lightning_indexer's and npu_sparse_flash_attention's, as pure functions (tested on CPU).

Sources (facts only; the checks in tests/backend/test_ascend_sparse.py are written from them):

- LI = torch_npu.npu_lightning_indexer(query, key, weights, *, actual_seq_lengths_query,
  actual_seq_lengths_key, block_table, layout_query, layout_key, sparse_count, sparse_mode) ->
  (sparse_indices, sparse_values) (CANN ops-transformer attention/lightning_indexer README; Ascend/op-plugin
  test_npu_lightning_indexer.py; vllm-ascend sfa_v1 calls it with layout_query "TND", layout_key "PA_BSND",
  sparse_mode 3). TND query [T, N1, D] with ``actual_seq_lengths_query`` int32 the cumulative query ends;
  PA_BSND key [block_num, block_size, 1, D] with ``actual_seq_lengths_key`` int32 each batch's KV length
  and ``block_table`` int32 [B, >= ceil(max len / block_size)]; weights [T, N1]; score = sum_h w * relu(q.k);
  sparse_mode 3 = rightDownCausal (the last query row of a batch sees all its keys). sparse_indices int32
  [T, 1, sparse_count]: positions within the batch's keys, -1 padded (the op-plugin test's reference fills
  -1 and writes min(sparse_count, KV length) entries, masked ones included: hence ``indices_from_npu``).
- SFA = torch_npu.npu_sparse_flash_attention(query, key, value, sparse_indices, scale_value, *,
  block_table, actual_seq_lengths_query, actual_seq_lengths_kv, query_rope, key_rope, sparse_block_size,
  layout_query, layout_kv, sparse_mode, attention_mode, return_softmax_lse) -> (out, softmax_max,
  softmax_sum) (op-plugin docs torch_npu-npu_sparse_flash_attention.md): sparse_indices int32 [T, KV_N=1,
  K], "the valid values of each row first, the invalid ones after"; sparse_block_size 1 = one token per
  index; attention_mode 2 = MLA-absorb (key and value the same tensor, query_rope/key_rope concatenated
  along D); layouts and lengths as LI's.

Index metadata is untrusted: lengths are clamped into the tensors they index, block ids into [0, NB),
and every sparse index outside a row's visible positions becomes -1 before it reaches the NPU, all on
the device (no host sync).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hetero.spec import AttentionMeta
from hetero_ascend.convert import safe_block_table

__all__ = [
    "DsaLengths",
    "dsa_lengths",
    "pa_bsnd",
    "indices_from_npu",
    "sfa_indices",
    "indexer_kwargs",
    "sfa_kwargs",
    "indexer_static",
    "sfa_static",
    "lightning_indexer",
    "sparse_flash_mla",
]


@dataclass(frozen=True)
class DsaLengths:
    """One step's lengths as the NPU ops take them, and each query row's view of its sequence.

    ``q_ends`` int32 [B] cumulative query ends (non-decreasing, within [0, T]); ``kv_lens`` int32 [B] KV
    lengths within [0, table columns * block_size]; ``block_table`` int32 with ids in [0, NB);
    ``pos`` int64 [T] each row's position (-1 for a row past the last query end: it sees nothing);
    ``length`` int64 [T] its sequence's (clamped) KV length (0 for such a row).
    """

    q_ends: torch.Tensor
    kv_lens: torch.Tensor
    block_table: torch.Tensor
    pos: torch.Tensor
    length: torch.Tensor


def dsa_lengths(meta: AttentionMeta, *, num_tokens: int, num_blocks: int, block_size: int) -> DsaLengths:
    """hetero's AttentionMeta as LI's / SFA's TND + PA_BSND lengths, with each row's position
    ``L - n + i`` (hetero's bottom-right alignment, the same as sparse_mode 3's rightDownCausal)."""
    dev = meta.seq_lens.device
    ends = meta.query_start_loc[1:].to(torch.int64).clamp(0, num_tokens)
    if ends.numel():
        ends = torch.cummax(ends, 0).values
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    cap = meta.block_table.shape[1] * block_size
    kv = meta.seq_lens.to(torch.int64).clamp(0, cap)
    rows = torch.arange(num_tokens, device=dev)
    seq = torch.searchsorted(ends, rows, right=True)  # the sequence owning each row (B: none)
    owned = seq < ends.numel()
    b = seq.clamp(max=max(ends.numel() - 1, 0))
    if ends.numel():
        length = torch.where(owned, kv[b], 0)
        pos = torch.where(owned, length - (ends[b] - starts[b]) + (rows - starts[b]), -1)
    else:
        length, pos = torch.zeros_like(rows), torch.full_like(rows, -1)
    return DsaLengths(
        ends.to(torch.int32), kv.to(torch.int32), safe_block_table(meta.block_table, num_blocks), pos, length
    )


def pa_bsnd(cache: torch.Tensor) -> torch.Tensor:
    """hetero's single-head paged cache [NB, BS, D] as PA_BSND [NB, BS, 1, D] (a view when contiguous;
    both ops reject a non-contiguous key on A2/A3)."""
    return cache.unsqueeze(2).contiguous()


def indices_from_npu(raw: torch.Tensor, lengths: DsaLengths) -> torch.Tensor:
    """LI's sparse_indices [T, 1, K] as hetero's int32 [T, K]: every entry outside the row's causal keys
    [0, pos] (the -1 padding, and the masked positions LI may list for a row with pos + 1 < K) is -1."""
    idx = raw.reshape(raw.shape[0], -1).to(torch.int64)
    keep = (idx >= 0) & (idx <= lengths.pos[:, None])
    return torch.where(keep, idx, -1).to(torch.int32)


def sfa_indices(topk_indices: torch.Tensor, lengths: DsaLengths, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """hetero's topk_indices [T, K] as SFA's int32 [T, 1, K] and whether each row keeps any entry.

    Kept: ``0 <= j <= pos`` (causal) or ``0 <= j < L`` (not), as the spec skips every other entry;
    the rest becomes -1 and the kept entries move to the front in their order (SFA's rule). The sort
    key is float32 (exact below 2**24), the AI Core sort."""
    idx = topk_indices.to(torch.int64)
    bound = lengths.pos[:, None] if causal else lengths.length[:, None] - 1
    keep = (idx >= 0) & (idx <= bound)
    order = torch.sort((~keep).to(torch.float32), dim=1, stable=True).indices
    packed = torch.where(keep, idx, -1).gather(1, order)
    return packed.to(torch.int32).unsqueeze(1).contiguous(), keep.any(dim=1)


def indexer_kwargs(lengths: DsaLengths, topk: int) -> dict:
    """LI's keyword arguments for hetero's indexer_topk (always causal: sparse_mode 3)."""
    return {
        "actual_seq_lengths_query": lengths.q_ends,
        "actual_seq_lengths_key": lengths.kv_lens,
        "block_table": lengths.block_table,
        "layout_query": "TND",
        "layout_key": "PA_BSND",
        "sparse_count": int(topk),
        "sparse_mode": 3,
    }


def sfa_kwargs(lengths: DsaLengths, causal: bool) -> dict:
    """SFA's keyword arguments besides the tensors: token-wise indices, MLA-absorb, no softmax statistics
    (return_softmax_lse is for training without PA_BSND only)."""
    return {
        "block_table": lengths.block_table,
        "actual_seq_lengths_query": lengths.q_ends,
        "actual_seq_lengths_kv": lengths.kv_lens,
        "sparse_block_size": 1,
        "layout_query": "TND",
        "layout_kv": "PA_BSND",
        "sparse_mode": 3 if causal else 0,
        "attention_mode": 2,
        "return_softmax_lse": False,
    }


def _first(res: Any) -> torch.Tensor:
    return res[0] if isinstance(res, (tuple, list)) else res


def indexer_static(q: torch.Tensor, index_cache: torch.Tensor, topk: int, index_scale: Any) -> dict:
    """The static configuration of an indexer_topk call, for ``support.indexer_reason``."""
    return {
        "dtype": q.dtype,
        "num_heads": q.shape[1],
        "head_dim": q.shape[2],
        "block_size": index_cache.shape[1],
        "topk": topk,
        "index_scale": index_scale is not None,
    }


def sfa_static(q_nope: torch.Tensor, q_pe: torch.Tensor, ckv_cache: torch.Tensor, return_lse: bool) -> dict:
    """The static configuration of a sparse mla_attention call, for ``support.sfa_reason``."""
    return {
        "dtype": q_nope.dtype,
        "num_heads": q_nope.shape[1],
        "block_size": ckv_cache.shape[1],
        "kv_lora_rank": q_nope.shape[2],
        "qk_rope_head_dim": q_pe.shape[2],
        "return_lse": return_lse,
    }


def lightning_indexer(
    npu: Any, q: torch.Tensor, weights: torch.Tensor, index_cache: torch.Tensor, meta: AttentionMeta, topk: int
) -> torch.Tensor:
    """hetero's indexer_topk through ``npu.npu_lightning_indexer`` (weights stay float32: the doc allows FLOAT
    weights with float16/bfloat16 query and key on A2/A3). No call for an empty step (the op rejects
    empty tensors)."""
    t = q.shape[0]
    if t == 0 or meta.num_seqs == 0:
        return torch.full((t, topk), -1, dtype=torch.int32, device=q.device)
    lengths = dsa_lengths(meta, num_tokens=t, num_blocks=index_cache.shape[0], block_size=index_cache.shape[1])
    raw = _first(
        npu.npu_lightning_indexer(
            q.contiguous(), pa_bsnd(index_cache), weights.float().contiguous(), **indexer_kwargs(lengths, topk)
        )
    )
    return indices_from_npu(raw, lengths)


def sparse_flash_mla(
    npu: Any,
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    ckv_cache: torch.Tensor,
    kpe_cache: torch.Tensor,
    meta: AttentionMeta,
    topk_indices: torch.Tensor,
    *,
    scale: float,
    causal: bool,
) -> torch.Tensor:
    """hetero's sparse mla_attention through ``npu.npu_sparse_flash_attention`` (MLA-absorb: the latent cache
    is both key and value). A row that keeps no index gets 0, whatever the op writes for it (undocumented)."""
    t, h, lkv = q_nope.shape
    if t == 0 or meta.num_seqs == 0:
        return q_nope.new_zeros(t, h, lkv)
    lengths = dsa_lengths(meta, num_tokens=t, num_blocks=ckv_cache.shape[0], block_size=ckv_cache.shape[1])
    idx, kept = sfa_indices(topk_indices, lengths, causal)
    ckv = pa_bsnd(ckv_cache)
    out = _first(
        npu.npu_sparse_flash_attention(
            q_nope.contiguous(),
            ckv,
            ckv,
            idx,
            float(scale),
            query_rope=q_pe.contiguous(),
            key_rope=pa_bsnd(kpe_cache),
            **sfa_kwargs(lengths, causal),
        )
    )
    return out.reshape(t, h, lkv).masked_fill(~kept[:, None, None], 0).to(q_nope.dtype)
