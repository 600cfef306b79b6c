"""Attention operators: paged KV cache (GQA/MQA and MLA), dense varlen, and merging.

Shapes: T query tokens packed token-major, Hq/Hkv query/KV heads, D/Dv key/value
head dims, NB cache blocks of BS slots. Metadata tensors are int32 unless said.
Softmax statistics (``lse``) are float32 ``[T, H]``, natural log, ``-inf`` for a
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
]

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
    causal=False. Logits ``s = scale * q.k``; with ``softcap`` c > 0,
    ``s = c * tanh(s / c)``. ``sinks`` float32 [Hq]: one extra logit per head
    that joins the softmax denominator and contributes no value.

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
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Absorbed multi-head latent attention over the paged latent cache.

    q_nope [T, H, Lkv] (the caller has absorbed W_UK into it), q_pe [T, H, R];
    ckv_cache [NB, BS, Lkv], kpe_cache [NB, BS, R], one latent "head" shared by
    all H query heads. Logits ``scale * (q_nope . ckv + q_pe . kpe)``, values are
    ``ckv``; positions, causality and the empty-row rule as in ``paged_attention``.
    DeepSeek's scale is ``(qk_nope_head_dim + qk_rope_head_dim) ** -0.5`` times the
    yarn mscale squared; it is always explicit.

    Returns out [T, H, Lkv] in the query's dtype (the caller applies W_UV), and
    with ``return_lse`` also lse float32 [T, H].
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
