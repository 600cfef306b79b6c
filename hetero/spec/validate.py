"""Index-content validation: the checks that read metadata tensors on the host.

Shape, dtype and device checks read only host metadata and are always on. The checks here read the *values* of
index tensors (block ids, slots, positions, cumulative lengths, group ends, expert ids, perm, state slots),
which on an accelerator is a device-to-host copy and a stream sync per call. A backend runs them when its
``validate`` flag is on (``hetero.load(name, validate=True)`` or ``HETERO_VALIDATE=1``); then every malformed
call raises an OpError naming the op, the argument, what was expected and what came, before any kernel runs.
With validation off, the kernels still never read or write outside their tensors (they mask every index they
load), but a malformed call's results are undefined.

One function per op that takes index tensors, named after it and taking the op's
own arguments, so that ``VALIDATORS[op](*args, **kwargs)`` checks a call as made.
Each first checks the type and rank of what it reads, so it can run before the
op's own shape checks. ``hetero.Ops`` runs them in front of a backend's ops when
validation is on, unless the backend checks index contents itself
(``Backend.validates_indices``, as the reference does). A call whose step plan
(``hetero.spec.types.Plan``) serves its index tensors and was checked when it was made
is not checked again: ``hetero.Ops.plan_attention`` and ``plan_recurrent`` check once per step.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import torch

from hetero.spec._checks_compress import kv_compress
from hetero.spec._checks_compressed_attention import compressed_attention  # spec 1.8: validated there
from hetero.spec._checks_dsa import check_compress_ratio
from hetero.spec._checks_meta import check_meta
from hetero.spec._checks_sampling import rejection_sample  # spec 1.10: validated there
from hetero.spec._validate_recurrent import causal_conv1d, gated_delta_rule  # per-token slots (1.11) there
from hetero.spec.checks import (
    check_cu_seqlens,
    check_fixed_ids,
    check_group_ends,
    check_ids,
    check_perm,
    check_positions,
    check_slot_mapping,
    check_tensor,
    expect,
)
from hetero.spec.types import AttentionMeta

__all__ = [
    "ENV",
    "default_validate",
    "write_kv",
    "write_mla_kv",
    "paged_attention",
    "mla_attention",
    "varlen_attention",
    "grouped_gemm",
    "scaled_grouped_gemm",
    "route",
    "moe_permute",
    "moe_unpermute",
    "fused_moe",
    "ep_dispatch",
    "rotary_embedding",
    "causal_conv1d",
    "gated_delta_rule",
    "write_index_k",
    "indexer_topk",
    "kv_compress",
    "VALIDATORS",
]

#: The environment variable that turns index validation on ("1") or off ("0") for every backend loaded.
ENV = "HETERO_VALIDATE"
_ON, _OFF = ("1", "true", "on", "yes"), ("0", "false", "off", "no")


def default_validate(device: torch.device, env: Mapping[str, str] | None = None) -> bool:
    """Whether index validation is on when ``hetero.load`` is not told: ``HETERO_VALIDATE`` when
    set, else on for CPU tensors (the host read is free there) and off on an accelerator
    (where it would cost a device-to-host sync per call)."""
    env = os.environ if env is None else env
    raw = env.get(ENV, "").strip().lower()
    if raw in _ON:
        return True
    if raw in _OFF:
        return False
    if raw:
        raise ValueError(f"{ENV}: expected one of {', '.join(_ON + _OFF)}, got {env[ENV]!r}")
    return device.type == "cpu"


def _cache_slots(op: str, arg: str, cache: object, ndim: int) -> tuple[int, int]:
    check_tensor(op, arg, cache, ndim=ndim)
    assert isinstance(cache, torch.Tensor)
    return cache.shape[0], cache.shape[1]


def _tokens(op: str, arg: str, x: object, ndim: int) -> int:
    check_tensor(op, arg, x, ndim=ndim)
    assert isinstance(x, torch.Tensor)
    return x.shape[0]


def write_kv(
    key: torch.Tensor, value: object, k_cache: torch.Tensor, v_cache: object, slot_mapping: torch.Tensor
) -> None:
    """slot_mapping int64 [T], every entry in [-1, NB*BS)."""
    nb, bs = _cache_slots("write_kv", "k_cache", k_cache, 4)
    check_slot_mapping("write_kv", slot_mapping, _tokens("write_kv", "key", key, 3), nb * bs)


def write_mla_kv(
    kv_c: torch.Tensor, k_pe: object, ckv_cache: torch.Tensor, kpe_cache: object, slot_mapping: torch.Tensor
) -> None:
    """slot_mapping int64 [T], every entry in [-1, NB*BS)."""
    nb, bs = _cache_slots("write_mla_kv", "ckv_cache", ckv_cache, 3)
    check_slot_mapping("write_mla_kv", slot_mapping, _tokens("write_mla_kv", "kv_c", kv_c, 2), nb * bs)


def _paged(
    op: str, query: object, q_arg: str, cache: object, cache_arg: str, ndim: int, meta: AttentionMeta, ratio: int = 1
) -> None:
    nb, bs = _cache_slots(op, cache_arg, cache, ndim)
    t = _tokens(op, q_arg, query, 3)
    plan = meta.planned(t, nb, bs) if isinstance(meta, AttentionMeta) else None
    if plan is None or not plan.checked:  # a plan checked at ratio 1 asked for more columns
        check_meta(op, meta, t, nb, bs, ratio)


def paged_attention(
    query: torch.Tensor, k_cache: torch.Tensor, v_cache: object, meta: AttentionMeta, **_: object
) -> None:
    """query_start_loc from 0 to T non-decreasing, seq_lens[b] >= its query length, enough
    block-table columns for seq_lens, block ids in [0, NB), max_query_len / max_seq_len bounds."""
    _paged("paged_attention", query, "query", k_cache, "k_cache", 4, meta)


def mla_attention(
    q_nope: torch.Tensor, q_pe: object, ckv_cache: torch.Tensor, kpe_cache: object, meta: AttentionMeta, **_: object
) -> None:
    """As paged_attention, over the latent cache. topk_indices needs no check: every entry outside
    a row's visible positions is skipped by definition (a kernel masks it)."""
    _paged("mla_attention", q_nope, "q_nope", ckv_cache, "ckv_cache", 3, meta)


def varlen_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: object,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    **_: object,
) -> None:
    """cu_seqlens_q from 0 to Tq and cu_seqlens_k from 0 to Tk, non-decreasing, one entry more
    than sequences each; max_seqlen_q/k at least the longest query/key length."""
    op = "varlen_attention"
    tq, tk = _tokens(op, "query", query, 3), _tokens(op, "key", key, 3)
    q = check_cu_seqlens(op, "cu_seqlens_q", cu_seqlens_q, tq)
    k = check_cu_seqlens(op, "cu_seqlens_k", cu_seqlens_k, tk, len(q) - 1)
    for arg, cu, longest in (("max_seqlen_q", q, max_seqlen_q), ("max_seqlen_k", k, max_seqlen_k)):
        need = max((cu[i + 1] - cu[i] for i in range(len(cu) - 1)), default=0)
        expect(
            isinstance(longest, int) and longest >= need,
            op,
            arg,
            f"at least the longest sequence ({need})",
            repr(longest),
        )


def grouped_gemm(a: torch.Tensor, b: torch.Tensor, group_ends: torch.Tensor, **_: object) -> None:
    """group_ends [G] non-decreasing within [0, M]."""
    rows = _tokens("grouped_gemm", "a", a, 2)
    check_group_ends("grouped_gemm", group_ends, _tokens("grouped_gemm", "b", b, 3), rows)


def scaled_grouped_gemm(
    a: torch.Tensor, b: torch.Tensor, a_scale: object, b_scale: object, group_ends: torch.Tensor, **_: object
) -> None:
    """group_ends [G] non-decreasing within [0, M], as grouped_gemm's."""
    op = "scaled_grouped_gemm"
    check_group_ends(op, group_ends, _tokens(op, "b", b, 3), _tokens(op, "a", a, 2))


def route(router_logits: torch.Tensor, *, fixed_ids: object = None, **_: object) -> None:
    """fixed_ids [M, k] (spec 1.8) in [0, E), E = router_logits.shape[1]."""
    if fixed_ids is not None:
        experts = check_tensor("route", "router_logits", router_logits, ndim=2).shape[1]
        check_fixed_ids("route", check_tensor("route", "fixed_ids", fixed_ids, ndim=2), experts)


def moe_permute(x: torch.Tensor, ids: torch.Tensor, num_experts: int) -> None:
    """ids [M, k] in [0, num_experts)."""
    check_ids("moe_permute", ids, _tokens("moe_permute", "x", x, 2), num_experts)


def moe_unpermute(y_sorted: torch.Tensor, perm: torch.Tensor, weights: object) -> None:
    """perm int64 [M*k], a permutation of range(M*k)."""
    check_perm("moe_unpermute", perm, _tokens("moe_unpermute", "y_sorted", y_sorted, 2))


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: object, weights: object, ids: torch.Tensor, **_: object) -> None:
    """ids [M, k] in [0, E), E = w13.shape[0]."""
    check_ids("fused_moe", ids, _tokens("fused_moe", "x", x, 2), _tokens("fused_moe", "w13", w13, 3))


def ep_dispatch(x: torch.Tensor, ids: torch.Tensor, weights: object, *, num_experts: int, **_: object) -> None:
    """ids [M, k] in [0, num_experts)."""
    check_ids("ep_dispatch", ids, _tokens("ep_dispatch", "x", x, 2), num_experts)


def rotary_embedding(positions: torch.Tensor, q: object, k: object, cos_sin_cache: torch.Tensor, **_: object) -> None:
    """positions int64 [T] in [0, max_pos), max_pos = cos_sin_cache.shape[0]."""
    op = "rotary_embedding"
    check_tensor(op, "positions", positions, ndim=1, dtypes=(torch.int64,))
    check_positions(op, positions, _tokens(op, "cos_sin_cache", cos_sin_cache, 2))


def write_index_k(k: torch.Tensor, index_cache: torch.Tensor, slot_mapping: torch.Tensor, **_: object) -> None:
    """slot_mapping int64 [T], every entry in [-1, NB*BS)."""
    nb, bs = _cache_slots("write_index_k", "index_cache", index_cache, 3)
    check_slot_mapping("write_index_k", slot_mapping, _tokens("write_index_k", "k", k, 2), nb * bs)


def indexer_topk(q: torch.Tensor, weights: object, index_cache: torch.Tensor, meta: AttentionMeta, **kw: Any) -> None:
    """As paged_attention, over the index-key cache (of ``seq_lens // compress_ratio`` entries, spec 1.8)."""
    ratio = check_compress_ratio("indexer_topk", kw.get("compress_ratio", 1))
    _paged("indexer_topk", q, "q", index_cache, "index_cache", 3, meta, ratio)


#: op name -> its index-content validator, for the ops that take index tensors.
VALIDATORS = {
    f.__name__: f
    for f in (
        write_kv,
        write_mla_kv,
        paged_attention,
        mla_attention,
        varlen_attention,
        grouped_gemm,
        scaled_grouped_gemm,
        route,
        moe_permute,
        moe_unpermute,
        fused_moe,
        ep_dispatch,
        rotary_embedding,
        causal_conv1d,
        gated_delta_rule,
        write_index_k,
        indexer_topk,
        compressed_attention,
        kv_compress,  # spec 1.8: hetero.spec._checks_compress
        rejection_sample,
    )
}
