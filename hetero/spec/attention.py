"""Attention operators: paged KV cache (GQA/MQA and MLA), dense varlen, and merging.

Shapes: T query tokens packed token-major, Hq/Hkv query/KV heads, D/Dv key/value
head dims, NB cache blocks of BS slots. Metadata tensors are int32 unless said.
``meta.plan`` (spec 1.6) is the step's plan of the metadata (``hetero.Ops.plan_attention``): optional,
it never changes the result. Softmax statistics (``lse``) are float32 ``[T, H]``, natural log, ``-inf`` for a
row that sees no key (its output is 0). Accumulation is at least float32; outputs
take the query's dtype.
"""

from __future__ import annotations

import torch

from hetero.spec._op import Output, spec_op
from hetero.spec.types import AttentionMeta

__all__ = [
    "write_kv",
    "paged_attention",
    "varlen_attention",
    "write_mla_kv",
    "mla_attention",
    "merge_attention",
    "write_index_k",
    "indexer_topk",
]

#: The fp8 format of an index-key cache: one float32 scale per token per group of this many channels.
INDEX_SCALE_GROUP = 128
#: The largest finite float8_e4m3fn value, and the floor of a group's absolute maximum before it is scaled.
FP8_E4M3_MAX, INDEX_AMAX_FLOOR = 448.0, 1e-4

#: The softmax statistics an attention op returns after ``out`` when asked with ``return_lse``.
_LSE = Output("lse", when="return_lse")


@spec_op(returns=(), mutates=(Output("k_cache", "exact"), Output("v_cache", "exact")))
def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter new keys and values into the paged cache, in place.

    key [T, Hkv, D], value [T, Hkv, Dv]; k_cache [NB, BS, Hkv, D], v_cache
    [NB, BS, Hkv, Dv], of the same dtype as key/value; slot_mapping int64 [T]
    with slot = block * BS + offset, or -1 to skip the token. Every slot not named
    is left untouched. Two tokens naming the same slot is undefined.
    """


@spec_op(returns=("out", _LSE), mutates=("out",))
def paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMeta,
    *,
    scale: float,
    causal: bool = True,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of packed queries over the paged KV cache: prefill, chunked prefill and decode.

    query [T, Hq, D]; k_cache [NB, BS, Hkv, D], v_cache [NB, BS, Hkv, Dv] of the
    query's dtype; Hq a multiple of Hkv (GQA; Hkv = 1 is MQA): query head h reads
    KV head ``h // (Hq // Hkv)``. Sequence b's keys are its first ``seq_lens[b]``
    cache positions, position j stored at block ``block_table[b, j // BS]``,
    offset ``j % BS``. Its query row i sits at position ``pos = L - n + i``.

    Key j is visible to a row at ``pos`` iff ``j <= pos`` (when causal) and
    ``j >= pos - window[0]`` (when ``window[0] >= 0``); ``window[1]`` bounds keys
    to the right (``j <= pos + window[1]``) when >= 0 and only matters with
    causal=False. A Hugging Face ``sliding_window`` of W (W keys, the token's own
    included: key j kept iff ``j > pos - W``; Mistral, Qwen2, gpt-oss) is
    ``window=(W - 1, -1)``; flash-attn's ``window_size_left`` is the same number.
    Logits ``s = scale * q.k``; with ``softcap`` c > 0, ``s = c * tanh(s / c)``.
    ``sinks`` float32 [Hq]: one extra logit per head that joins the softmax
    denominator and contributes no value. It joins it with any window: a row's
    denominator is the sink's exp plus the exps of the keys its window keeps
    (gpt-oss's alternating sliding layers).

    Returns out [T, Hq, Dv] in the query's dtype (written into ``out`` when given),
    and with ``return_lse`` also lse float32 [T, Hq] = logsumexp of the visible
    logits (sinks excluded). A row that sees no key gets out 0 and lse -inf.
    """


@spec_op(returns=("out", _LSE))
def varlen_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    scale: float,
    causal: bool = True,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Dense attention over packed sequences, without a cache (MLA prefill: D=192, Dv=128).

    query [Tq, Hq, D], key [Tk, Hkv, D], value [Tk, Hkv, Dv]; cu_seqlens_q and
    cu_seqlens_k int32 [B+1], cumulative, from 0 to Tq and Tk; max_seqlen_q/k are
    host ints bounding the lengths. Sequence b's query row i (of n) sits at
    position ``Lk - n + i`` where Lk is its key count (bottom-right causal), and
    masking, GQA, softcap and the empty-row rule are those of ``paged_attention``.

    Returns out [Tq, Hq, Dv] in the query's dtype, and with ``return_lse`` also
    lse float32 [Tq, Hq].
    """


@spec_op(returns=(), mutates=(Output("ckv_cache", "exact"), Output("kpe_cache", "exact")))
def write_mla_kv(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    ckv_cache: torch.Tensor,
    kpe_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter the MLA latent and rope key into their paged caches, in place.

    kv_c [T, Lkv] (DeepSeek: Lkv = 512), k_pe [T, R] (R = 64); ckv_cache
    [NB, BS, Lkv], kpe_cache [NB, BS, R] of the same dtype; slot_mapping int64 [T]
    as in ``write_kv`` (-1 skips the token).
    """


@spec_op(returns=("out", _LSE))
def mla_attention(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    ckv_cache: torch.Tensor,
    kpe_cache: torch.Tensor,
    meta: AttentionMeta,
    *,
    scale: float,
    causal: bool = True,
    return_lse: bool = False,
    topk_indices: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Absorbed multi-head latent attention over the paged latent cache, dense or sparse (DSA).

    q_nope [T, H, Lkv] (the caller has absorbed W_UK into it), q_pe [T, H, R];
    ckv_cache [NB, BS, Lkv], kpe_cache [NB, BS, R], one latent "head" shared by
    all H query heads. Logits ``scale * (q_nope . ckv + q_pe . kpe)``, values are
    ``ckv``; positions, causality and the empty-row rule as in ``paged_attention``.
    DeepSeek's scale is ``(qk_nope_head_dim + qk_rope_head_dim) ** -0.5`` times the
    yarn mscale squared; it is always explicit.

    ``topk_indices`` int32 (or int64) [T, K], K >= 1 (None: dense): the sparse
    attention of DeepSeek-V3.2 and GLM-5. Row t attends only to the positions its
    row lists that are visible to it (``0 <= j <= pos`` when causal, ``j <
    seq_len`` otherwise), all heads alike; every other entry, the -1 padding of
    ``indexer_topk`` included, is skipped. Entries are positions, not slots. A
    position listed twice in one row is undefined (``indexer_topk`` never does);
    a row left with no position gets out 0 and lse -inf. The same call serves
    prefill, chunked prefill and decode.

    ``sinks`` float32 [H] (spec 1.7; None: no sinks): one learned logit per query
    head that joins the softmax denominator and contributes no value, as in
    ``paged_attention``, dense or sparse alike: row t of head h normalizes by
    ``exp(sinks[h])`` plus the exps of the logits it sees (Hunyuan HY4, whose
    transformers attention passes them as gpt-oss's ``s_aux``). Under tensor
    parallelism the caller passes its own heads' sinks. A row that sees no key
    still gets out 0 and lse -inf.

    Returns out [T, H, Lkv] in the query's dtype (the caller applies W_UV), and
    with ``return_lse`` also lse float32 [T, H] = logsumexp of the visible logits
    (sinks excluded).
    """


@spec_op(returns=("out", "lse"))
def merge_attention(
    out_a: torch.Tensor,
    lse_a: torch.Tensor,
    out_b: torch.Tensor,
    lse_b: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine two partial attentions of the same queries over disjoint key sets.

    out_a, out_b [T, H, Dv] of one dtype; lse_a, lse_b float32 [T, H] (natural log).
    ``lse = logaddexp(lse_a, lse_b)`` and ``out = exp(lse_a - lse) * out_a +
    exp(lse_b - lse) * out_b``; a side with lse -inf contributes nothing, and a row
    where both are -inf gets out 0 and lse -inf. Returns (out in the inputs'
    dtype, lse float32).
    """


@spec_op(returns=(), mutates=(Output("index_cache", "exact"), Output("index_scale", "exact", when="index_scale")))
def write_index_k(
    k: torch.Tensor,
    index_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    index_scale: torch.Tensor | None = None,
) -> None:
    """Scatter the lightning indexer's keys into its paged single-head cache, in place.

    k [T, D] (post-norm, post-rope; DeepSeek-V3.2 and GLM-5: D = 128);
    index_cache [NB, BS, D]; slot_mapping int64 [T] with the rules of ``write_kv``
    (-1 skips the token; every slot not named is untouched). The index cache shares
    the block ids of the layer's attention cache.

    Plain format (``index_scale`` None): index_cache has k's dtype and receives exact copies.
    Optional fp8 format, declined with a reason by a backend that lacks it:
    index_cache float8_e4m3fn and index_scale float32 [NB, BS, D // 128] (D a multiple
    of 128). For each token and each group g of 128 channels, in float32 (k is first
    rounded to float32 whatever its dtype): ``amax = max(max|k_g|, 1e-4)``,
    ``s = amax / 448``, ``index_scale[slot, g] = s`` and ``index_cache[slot, g] =
    clamp(k_g / s, -448, 448)`` rounded to the nearest e4m3fn value (ties to even). Both are
    compared bit for bit.
    """


@spec_op(returns=(Output("indices", "row_set"),))
def indexer_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_cache: torch.Tensor,
    meta: AttentionMeta,
    *,
    topk: int,
    index_scale: torch.Tensor | None = None,
    compress_ratio: int = 1,
) -> torch.Tensor:
    """The lightning indexer of DSA fused with its top-k: which keys each query row attends to.

    q [T, Hi, D] (post-rope; DeepSeek-V3.2 Hi = 64, GLM-5 Hi = 32, D = 128);
    weights float32 [T, Hi] (float64 too, for the oracle); index_cache [NB, BS, D] of q's dtype, or the fp8 format of
    ``write_index_k`` with its index_scale (keys dequantized as ``q8 * s``); meta as
    for ``paged_attention`` (the index cache shares the attention cache's blocks).
    The caller folds every scale into the weights (transformers:
    ``weights_proj(x) * Hi**-0.5 * D**-0.5``). For query row t at position pos and
    each key position ``j <= pos`` (always causal), in float32 or wider::

        score[t, j] = sum_h weights[t, h] * max(0, q[t, h] . k[j])

    With ``keep = min(topk, pos + 1)``, row t of the result lists the keep positions
    with the largest scores, a tie going to the smaller position (so the set is
    unique), then ``topk - keep`` entries of -1. The order within a row is free: the
    result is compared as a set. The scores never leave the op. Returns indices int32
    [T, topk] (topk >= 1), ready for ``mla_attention(topk_indices=...)``.

    ``compress_ratio`` m > 1 (spec 1.8, DeepSeek-V4's CSA indexer): the cache holds compressed
    keys, entry j the pool of tokens ``[j*m, (j+1)*m)`` (``hetero.spec.compressed``), addressed
    through ``meta.block_table`` (the compressed cache's block table) at block ``j // BS``, offset
    ``j % BS``; ``seq_lens`` still count tokens. Key j is visible iff ``j < (pos + 1) // m`` (its
    window has closed), so ``keep = min(topk, (pos + 1) // m)``; the scores, the tie rule and the
    -1 padding are as above, and the result feeds ``compressed_attention(topk_indices=...)``.
    m = 1 is the rule above.
    """
