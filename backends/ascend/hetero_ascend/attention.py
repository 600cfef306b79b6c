"""The attention ops of the ascend backend on torch_npu: FIA (npu_fused_infer_attention_score) for paged,
dense and MLA attention, the DSA operators (npu_lightning_indexer, npu_sparse_flash_attention) for the
sparse path. None has run on an NPU; the conversions are tested on CPU. Calls outside an operator's
documented limits go to the portable Triton kernel."""

from __future__ import annotations

import functools

import torch

from hetero.spec.checks import check_indexer_inputs, check_meta_shapes, check_mla_inputs, check_topk_indices
from hetero.spec.types import FLOAT_DTYPES
from hetero_ascend import common, convert, sparse, support
from hetero_ascend.common import WithTriton

__all__ = ["paged_attention", "varlen_attention", "mla_attention", "indexer_topk", "NOTES"]

#: The activation dtypes of the Triton kernels (float64 is the reference's).
_KERNEL_DTYPES = tuple(d for d in FLOAT_DTYPES if d is not torch.float64)


def _fia(
    query,
    key,
    value,
    q_lens,
    kv_lens,
    *,
    scale,
    causal,
    window,
    return_lse,
    block_table=None,
    block_size=0,
    num_kv_heads,
    query_rope=None,
    key_rope=None,
):
    sp = convert.sparse_args(causal, window)
    out, lse = common.torch_npu().npu_fused_infer_attention_score(
        convert.tnd_query(query),
        key,
        value,
        query_rope=query_rope,
        key_rope=key_rope,
        atten_mask=convert.causal_mask(str(query.device)) if sp["mask"] else None,
        actual_seq_lengths=q_lens,
        actual_seq_lengths_kv=kv_lens,
        block_table=block_table,
        block_size=block_size,
        num_heads=query.shape[1],
        num_key_value_heads=num_kv_heads,
        scale=scale,
        input_layout="TND",
        sparse_mode=sp["sparse_mode"],
        pre_tokens=sp["pre_tokens"],
        next_tokens=sp["next_tokens"],
        softmax_lse_flag=return_lse,
    )
    return (out, convert.lse_from_npu(lse)) if return_lse else out


def paged_attention(
    query,
    k_cache,
    v_cache,
    meta,
    *,
    scale,
    causal=True,
    window=(-1, -1),
    softcap=0.0,
    sinks=None,
    out=None,
    return_lse=False,
):
    """torch_npu.npu_fused_infer_attention_score, TND + block_table; never run on an NPU
    (conversions tested on CPU)."""
    q_lens, kv_lens = convert.paged_lengths(meta, num_tokens=query.shape[0], block_size=k_cache.shape[1])
    res = _fia(
        query,
        convert.paged_kv_bsh(k_cache),
        convert.paged_kv_bsh(v_cache),
        q_lens,
        kv_lens,
        scale=scale,
        causal=causal,
        window=window,
        return_lse=return_lse,
        block_table=convert.safe_block_table(meta.block_table, k_cache.shape[0]),
        block_size=k_cache.shape[1],
        num_kv_heads=k_cache.shape[2],
    )
    if out is None:
        return res
    out.copy_(res[0] if return_lse else res)
    return (out, res[1]) if return_lse else out


def varlen_attention(
    query,
    key,
    value,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    *,
    scale,
    causal=True,
    window=(-1, -1),
    softcap=0.0,
    return_lse=False,
):
    """torch_npu.npu_fused_infer_attention_score, dense TND; never run on an NPU (conversions tested on CPU)."""
    q_lens, kv_lens = convert.varlen_lengths(
        cu_seqlens_q, cu_seqlens_k, num_tokens=query.shape[0], num_keys=key.shape[0]
    )
    return _fia(
        query,
        key.contiguous(),
        value.contiguous(),
        q_lens,
        kv_lens,
        scale=scale,
        causal=causal,
        window=window,
        return_lse=return_lse,
        num_kv_heads=key.shape[1],
    )


@WithTriton
def mla_attention(
    triton,
    q_nope,
    q_pe,
    ckv_cache,
    kpe_cache,
    meta,
    *,
    scale,
    causal=True,
    return_lse=False,
    topk_indices=None,
    sinks=None,
):
    """FIA's MLA form (query_rope/key_rope, D = 512); with ``topk_indices``, npu_sparse_flash_attention;
    never run on an NPU (conversions tested on CPU). FIA takes 1..16 query rows per sequence here (doc):
    longer chunks, calls outside SFA's documented limits, and sinks (neither operator has them;
    ``supports`` declines them), go to the Triton kernel."""
    on_triton = functools.partial(
        triton.mla_attention,
        q_nope,
        q_pe,
        ckv_cache,
        kpe_cache,
        meta,
        scale=scale,
        causal=causal,
        return_lse=return_lse,
        topk_indices=topk_indices,
        sinks=sinks,
    )
    if sinks is not None:
        return on_triton()
    if topk_indices is not None:  # the always-on checks first: the SFA conversion indexes by them
        t = check_mla_inputs("mla_attention", q_nope, q_pe, ckv_cache, kpe_cache, _KERNEL_DTYPES)[0]
        check_meta_shapes("mla_attention", meta, t)
        check_topk_indices("mla_attention", topk_indices, t, q_nope.device)
        if support.sfa_reason(sparse.sfa_static(q_nope, q_pe, ckv_cache, return_lse)) is not None:
            return on_triton()
        return sparse.sparse_flash_mla(
            common.torch_npu(), q_nope, q_pe, ckv_cache, kpe_cache, meta, topk_indices, scale=scale, causal=causal
        )
    if meta.max_query_len > 16 or return_lse:
        return on_triton()
    q_lens, kv_lens = convert.paged_lengths(meta, num_tokens=q_nope.shape[0], block_size=ckv_cache.shape[1])
    ckv = convert.paged_kv_bsh(ckv_cache)
    return _fia(
        q_nope,
        ckv,
        ckv,
        q_lens,
        kv_lens,
        scale=scale,
        causal=causal and meta.max_query_len > 1,
        window=(-1, -1),
        return_lse=False,
        block_table=convert.safe_block_table(meta.block_table, ckv_cache.shape[0]),
        block_size=ckv_cache.shape[1],
        num_kv_heads=1,
        query_rope=convert.tnd_query(q_pe),
        key_rope=convert.paged_kv_bsh(kpe_cache),
    )


@WithTriton
def indexer_topk(triton, q, weights, index_cache, meta, *, topk, index_scale=None, compress_ratio=1):
    """torch_npu.npu_lightning_indexer (TND query, PA_BSND key, sparse_mode 3); never run on an NPU
    (conversions tested on CPU). Calls outside its documented limits (a compressed cache among them)
    go to the Triton kernel."""
    t = check_indexer_inputs("indexer_topk", q, weights, index_cache, meta, topk, index_scale, compress_ratio)[0]
    check_meta_shapes("indexer_topk", meta, t)
    static = {**sparse.indexer_static(q, index_cache, topk, index_scale), "compress_ratio": compress_ratio}
    if support.indexer_reason(static) is not None:
        return triton.indexer_topk(
            q, weights, index_cache, meta, topk=topk, index_scale=index_scale, compress_ratio=compress_ratio
        )
    return sparse.lightning_indexer(common.torch_npu(), q, weights, index_cache, meta, topk)


#: What the DSA mappings assume and nothing here could check (shown by ``op_notes`` / explain).
NOTES = {
    "indexer_topk": (
        f"mapped to torch_npu.npu_lightning_indexer (TND + PA_BSND, sparse_mode 3, float32 weights) "
        f"where its documented limits allow (64 heads, D 128, topk <= 2048, plain cache), else the "
        f"Triton kernel; assumed: scores accumulated in float32 (the doc's test reference does), indices "
        f"are positions within the sequence, and ties at the k-th score keep the smaller position "
        f"(the doc states no tie rule: the spec's set may differ there); {support.NEVER_RUN}"
    ),
    "mla_attention": (
        f"mapped to torch_npu.npu_fused_infer_attention_score (dense, <= 16 query rows) and "
        f"torch_npu.npu_sparse_flash_attention (topk_indices; MLA-absorb, token-wise) where their "
        f"documented limits allow, else the Triton kernel; assumed: SFA reads position j of a "
        f"sequence through its block table and skips -1 entries; {support.NEVER_RUN}"
    ),
}
