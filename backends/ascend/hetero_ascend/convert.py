"""Every conversion between hetero's arguments and torch_npu's, as pure functions (tested on CPU).

Sources (facts only; see tests/backends/test_ascend_convert.py for the semantics checked):

- FIA = torch_npu.npu_fused_infer_attention_score, Ascend/op-plugin
  docs/context/torch_npu-npu_fused_infer_attention_score.md: TND layout; with TND,
  ``actual_seq_lengths`` holds cumulative query lengths ("each element is the sum of this batch's
  and all previous batches' lengths"); with page attention ``actual_seq_lengths_kv`` holds each
  batch's KV length and ``block_table`` is int32 [B, maxBlocks]; paged KV may be laid out
  (blocknum, blocksize, H) or (blocknum, KV_N, blocksize, D); ``atten_mask`` 1 = masked;
  sparse_mode 3 = rightDownCausal and 4 = band, both with the compressed 2048x2048 lower-triangular
  mask; ``pre_tokens``/``next_tokens`` = how many tokens before/after a query it attends to;
  softmax_lse is (T, N, 1) float32 with TND.
  vllm-ascend (vllm_ascend/attention/attention_v1.py) calls FIA in exactly this TND + block_table
  + sparse_mode=3 form; sglang's ascend backend passes cumulative KV lengths for dense TND.
- npu_grouped_matmul (hiascend Pytorch 7.0.0 apilist ptaoplist_000524): group_list int64,
  group_list_type 0 = cumsum, 1 = counts; weight per group [K, N] (x @ w).
- aclnnMoeTokenUnpermute (hiascend CANN 8.2 aolapi): out[i] = sum_j T[S[i*k+j]] * P[i][j].

Index metadata is untrusted (validation off): every index that reaches torch_npu is first clamped
into its tensor's range on the device (no host sync) or, for the host length lists FIA takes,
after the read it needs anyway. A malformed call then computes garbage, never an access outside a
tensor (on an NPU that would be an AI Core exception).
"""

from __future__ import annotations

import functools

import torch

from hetero.spec import AttentionMeta

__all__ = [
    "INT_MAX",
    "MASK_EDGE",
    "SPARSE_NONE",
    "SPARSE_RIGHT_DOWN_CAUSAL",
    "SPARSE_BAND",
    "paged_lengths",
    "varlen_lengths",
    "safe_block_table",
    "safe_expert_ids",
    "sparse_args",
    "causal_mask",
    "paged_kv_bsh",
    "paged_kv_bnsd",
    "tnd_query",
    "lse_from_npu",
    "group_list",
    "grouped_weights",
    "perm_from_row_idx",
    "unpermute_indices",
    "gating_args",
    "rotary_factors",
    "MLA_QUERY_HEADS",
]

INT_MAX = 2147483647  # FIA's default pre_tokens / next_tokens ("no limit")
MASK_EDGE = 2048  # sparse_mode 2/3/4 take an optimized (2048, 2048) mask
SPARSE_NONE, SPARSE_RIGHT_DOWN_CAUSAL, SPARSE_BAND = 0, 3, 4
MLA_QUERY_HEADS = (32, 64, 128)  # FIA MLA (D=512): query n must be 32/64/128, kv n 1


def _cumulative(ends: list[int], limit: int | None) -> list[int]:
    """Cumulative ends made non-decreasing, >= 0 and (when known) <= limit."""
    out, last = [], 0
    for v in ends:
        last = max(last, int(v))
        out.append(last if limit is None else min(last, limit))
    return out


def paged_lengths(
    meta: AttentionMeta, *, num_tokens: int | None = None, block_size: int | None = None
) -> tuple[list[int], list[int]]:
    """(actual_seq_lengths, actual_seq_lengths_kv) host lists for FIA in TND with a block table:
    cumulative query ends (query_start_loc[1:]) and per-sequence KV lengths (seq_lens), clamped to
    T = ``num_tokens`` and to the table's columns * ``block_size`` when those are given."""
    q_ends = _cumulative(meta.query_start_loc[1:].tolist(), num_tokens)
    cap = meta.block_table.shape[1] * block_size if block_size is not None else None
    kv = [max(0, int(v)) if cap is None else min(max(0, int(v)), cap) for v in meta.seq_lens.tolist()]
    return q_ends, kv


def varlen_lengths(
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    num_tokens: int | None = None,
    num_keys: int | None = None,
) -> tuple[list[int], list[int]]:
    """Host lists for dense TND: both cumulative (cu_seqlens[1:]), non-decreasing, within T / Tk when given."""
    return _cumulative(cu_seqlens_q[1:].tolist(), num_tokens), _cumulative(cu_seqlens_k[1:].tolist(), num_keys)


def safe_block_table(block_table: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """The int32 block table FIA reads, every id outside [0, NB) replaced by block 0 (on the device)."""
    ok = (block_table >= 0) & (block_table < num_blocks)
    return torch.where(ok, block_table, torch.zeros_like(block_table)).to(torch.int32)


def safe_expert_ids(ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """int32 expert ids clamped into [0, E) on the device (the routing ops index their experts by them)."""
    return ids.clamp(0, max(num_experts - 1, 0)).to(torch.int32)


def sparse_args(causal: bool, window: tuple[int, int]) -> dict:
    """hetero's (causal, window) as FIA's sparse_mode / pre_tokens / next_tokens (+ whether a mask is needed).

    hetero: key j visible at pos iff j <= pos (causal), pos - window[0] <= j (window[0] >= 0),
    j <= pos + window[1] (window[1] >= 0). FIA's band counts pre_tokens keys before the query and
    next_tokens after it, so pre_tokens = window[0] (j = pos - window[0] is the last one included).
    Queries are aligned bottom-right (rightDown) in both.
    """
    left, right = int(window[0]), int(window[1])
    if left < 0 and (causal or right < 0):
        if causal:
            return {"sparse_mode": SPARSE_RIGHT_DOWN_CAUSAL, "pre_tokens": INT_MAX, "next_tokens": 0, "mask": True}
        return {"sparse_mode": SPARSE_NONE, "pre_tokens": INT_MAX, "next_tokens": INT_MAX, "mask": False}
    pre = left if left >= 0 else INT_MAX
    nxt = 0 if causal else (right if right >= 0 else INT_MAX)
    return {"sparse_mode": SPARSE_BAND, "pre_tokens": pre, "next_tokens": nxt, "mask": True}


@functools.lru_cache(maxsize=8)
def causal_mask(device: str = "cpu") -> torch.Tensor:
    """The cached compressed (2048, 2048) mask: bool, True (1) above the diagonal = not computed."""
    return torch.ones(MASK_EDGE, MASK_EDGE, dtype=torch.bool, device=device).triu_(1)


def paged_kv_bsh(cache: torch.Tensor) -> torch.Tensor:
    """hetero's [NB, BS, Hkv, D] (or MLA [NB, BS, L]) cache as FIA's (blocknum, blocksize, H): a view."""
    return cache.reshape(cache.shape[0], cache.shape[1], -1)


def paged_kv_bnsd(cache: torch.Tensor) -> torch.Tensor:
    """[NB, BS, Hkv, D] as (blocknum, KV_N, blocksize, D), the form FIA needs when KV_N * D > 65535 (a copy)."""
    return cache.permute(0, 2, 1, 3).contiguous()


def tnd_query(query: torch.Tensor) -> torch.Tensor:
    """hetero's packed [T, H, D] query is FIA's TND already; FIA rejects non-contiguous tensors."""
    return query.contiguous()


def lse_from_npu(lse: torch.Tensor) -> torch.Tensor:
    """FIA's softmax_lse (T, N, 1) as hetero's float32 [T, N] with -inf for rows that see no key.
    (What FIA writes for such rows is undocumented: +inf and NaN are both mapped to -inf.)"""
    out = lse.reshape(lse.shape[0], lse.shape[1]).float()
    return out.masked_fill(torch.isnan(out) | (out == float("inf")), float("-inf"))


def group_list(group_ends: torch.Tensor, group_list_type: int = 0, rows: int | None = None) -> torch.Tensor:
    """hetero's int32 group end offsets as npu_grouped_matmul's int64 group_list:
    type 0 = cumsum (the ends themselves), type 1 = per-group counts; ends kept within [0, rows]
    and non-decreasing (on the device)."""
    ends = group_ends.to(torch.int64).clamp(min=0)
    if rows is not None:
        ends = ends.clamp(max=rows)
    if ends.numel():  # decreasing ends: empty groups, not negative counts
        ends = torch.cummax(ends, 0).values
    if group_list_type == 0:
        return ends
    if group_list_type == 1:
        return torch.diff(ends, prepend=ends.new_zeros(1))
    raise ValueError(f"group_list_type is 0 (cumsum) or 1 (counts), not {group_list_type}")


def grouped_weights(b: torch.Tensor) -> torch.Tensor:
    """hetero's nn.Linear-layout weights [G, N, K] as the [G, K, N] operand of x @ w (a view)."""
    return b.transpose(1, 2)


def perm_from_row_idx(expanded_row_idx: torch.Tensor) -> torch.Tensor:
    """npu_moe_init_routing_v2's expanded_row_idx (row_idx_type 0: for flat pair f = m*k + s, the
    row of expanded_x holding it) as hetero's perm (for each sorted row, its flat pair): the inverse."""
    idx = expanded_row_idx.to(torch.int64).reshape(-1)
    idx = idx.clamp(0, max(idx.numel() - 1, 0))  # an out-of-range row id must not reach scatter_
    return torch.zeros_like(idx).scatter_(0, idx, torch.arange(idx.numel(), dtype=torch.int64, device=idx.device))


def unpermute_indices(perm: torch.Tensor) -> torch.Tensor:
    """hetero's perm as npu_moe_token_unpermute's int32 sorted_indices S (S[f] = row of flat pair f)."""
    p = perm.to(torch.int64).clamp(0, max(perm.numel() - 1, 0))  # an out-of-range perm value must not reach scatter_
    return (
        torch.zeros_like(p).scatter_(0, p, torch.arange(p.numel(), dtype=torch.int64, device=p.device)).to(torch.int32)
    )


def gating_args(
    top_k: int, scoring: str, n_group: int, topk_group: int, has_bias: bool, routed_scaling_factor: float
) -> dict:
    """hetero route options as npu_moe_gating_top_k keyword arguments (aclnnMoeGatingTopK doc):
    norm_type 0 softmax / 1 sigmoid; group_select_mode 0 = group max (DeepSeek-V2), 1 = sum of the
    top two (DeepSeek-V3, hetero's rule when a correction bias is given); the output weights are
    renormalized (y / (sum y + eps)) and scaled."""
    return {
        "k": int(top_k),
        "k_group": int(topk_group) if n_group > 1 else 1,
        "group_count": int(n_group),
        "group_select_mode": 1 if has_bias else 0,
        "renorm": 0,
        "norm_type": 0 if scoring == "softmax" else 1,
        "out_flag": False,
        "routed_scaling_factor": float(routed_scaling_factor),
        "eps": 1e-20,
    }


def rotary_factors(positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(r1, r2) for npu_rotary_mul's neox ("half") mode, y = x * r1 + rotate_half(x) * r2, as
    [T, 1, 1, rot] to broadcast over a [T, 1, H, rot] ("BSND", S = 1) view of q / k."""
    pos = positions.to(torch.int64)
    ok = ((pos >= 0) & (pos < cos_sin_cache.shape[0]))[:, None]
    cos, sin = cos_sin_cache[torch.where(ok[:, 0], pos, 0)].chunk(2, dim=-1)
    cos, sin = torch.where(ok, cos, 1.0), torch.where(ok, sin, 0.0)  # out of range: angle 0, as the Triton kernel
    r1, r2 = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
    return r1[:, None, None, :], r2[:, None, None, :]
