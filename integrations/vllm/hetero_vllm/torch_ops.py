"""hetero's ops as opaque ``torch.library`` custom ops (namespace ``hetero``), each with a fake implementation.

Dynamo cannot trace hetero's Python (plugin lookup, argument checks), so vLLM's
compiled mode needs each op as one opaque node: ``torch.ops.hetero.<op>``. The
real implementation calls the process's hetero op table (``_backend.ops()``,
loaded on first use) and counts the call in ``report`` under ``site``, the vLLM
layer class it serves; the fake one only gives shapes and dtypes. Shapes and
semantics are hetero's (``hetero.spec``); the extra arguments are flattened
forms of hetero's (``AttentionMeta`` fields, the attention window pair).
"""

from __future__ import annotations

import torch

from hetero_vllm import _backend, report

__all__ = [
    "rms_norm",
    "fused_add_rms_norm",
    "silu_and_mul",
    "rotary_embedding",
    "write_kv",
    "paged_attention",
    "fused_moe",
]


def _fresh(out: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
    """out, copied if it shares memory with an input (a custom op's outputs may not alias its inputs)."""
    ptr = out.untyped_storage().data_ptr()
    return out.clone() if any(t.untyped_storage().data_ptr() == ptr for t in inputs) else out


@torch.library.custom_op("hetero::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, site: str) -> torch.Tensor:
    """hetero ``rms_norm(x, weight, eps)``: x [..., H], weight [H]."""
    report.record(site, "rms_norm")
    return _fresh(_backend.ops().rms_norm(x, weight, eps), x)


@rms_norm.register_fake
def _(x, weight, eps, site):
    return torch.empty_like(x)


@torch.library.custom_op("hetero::fused_add_rms_norm", mutates_args=())
def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, site: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """hetero ``rms_norm(x, weight, eps, residual=residual)``: returns (norm(x + residual), x + residual)."""
    report.record(site, "rms_norm+residual")
    out, h = _backend.ops().rms_norm(x, weight, eps, residual=residual)
    return _fresh(out, x, residual), _fresh(h, x, residual)


@fused_add_rms_norm.register_fake
def _(x, residual, weight, eps, site):
    return torch.empty_like(x), torch.empty_like(x)


@torch.library.custom_op("hetero::silu_and_mul", mutates_args=())
def silu_and_mul(x: torch.Tensor, site: str) -> torch.Tensor:
    """hetero ``silu_and_mul(x)``: x [..., 2I] -> [..., I]."""
    report.record(site, "silu_and_mul")
    return _fresh(_backend.ops().silu_and_mul(x), x)


@silu_and_mul.register_fake
def _(x, site):
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


@torch.library.custom_op("hetero::rotary_embedding", mutates_args=())
def rotary_embedding(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor, is_neox: bool, site: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """hetero ``rotary_embedding``: positions int64 [T], q [T, Hq, D], k [T, Hkv, D]; returns new (q, k)."""
    report.record(site, "rotary_embedding")
    q_out, k_out = _backend.ops().rotary_embedding(positions, q, k, cos_sin_cache, is_neox=is_neox)
    return _fresh(q_out, q, k), _fresh(k_out, q, k)


@rotary_embedding.register_fake
def _(positions, q, k, cos_sin_cache, is_neox, site):
    return torch.empty_like(q), torch.empty_like(k)


@torch.library.custom_op("hetero::write_kv", mutates_args=("k_cache", "v_cache"))
def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    site: str,
) -> None:
    """hetero ``write_kv``: scatters key/value [T, Hkv, D] into the caches [NB, BS, Hkv, D] (strided views allowed)."""
    report.record(site, "write_kv")
    _backend.ops().write_kv(key, value, k_cache, v_cache, slot_mapping)


@write_kv.register_fake
def _(key, value, k_cache, v_cache, slot_mapping, site):
    return None


@torch.library.custom_op("hetero::paged_attention", mutates_args=("out",))
def paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_query_len: int,
    max_seq_len: int,
    scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    sinks: torch.Tensor | None,
    out: torch.Tensor,
    site: str,
) -> None:
    """hetero ``paged_attention`` into ``out`` [T, Hq, Dv]; the metadata fields are ``hetero.AttentionMeta``'s."""
    import hetero

    report.record(site, "paged_attention")
    meta = hetero.AttentionMeta(query_start_loc, seq_lens, block_table, max_query_len, max_seq_len)
    _backend.ops().paged_attention(
        query,
        k_cache,
        v_cache,
        meta,
        scale=scale,
        causal=causal,
        window=(window_left, window_right),
        softcap=softcap,
        sinks=sinks,
        out=out,
    )


@paged_attention.register_fake
def _(
    query,
    k_cache,
    v_cache,
    query_start_loc,
    seq_lens,
    block_table,
    max_query_len,
    max_seq_len,
    scale,
    causal,
    window_left,
    window_right,
    softcap,
    sinks,
    out,
    site,
):
    return None


@torch.library.custom_op("hetero::fused_moe", mutates_args=())
def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    activation: str,
    site: str,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    alpha: float = 1.702,
    limit: float | None = None,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    act_quant: str | None = None,
    act_scale_fmt: str = "float",
) -> torch.Tensor:
    """hetero ``fused_moe``: x [M, H], w13 [E, 2I, H] (gate rows, then up rows), w2 [E, H, I], weights float32
    [M, k], ids int32 [M, k]; the optional arguments are hetero's keywords of the same names (biases [E, 2I] and
    [E, H]; ``alpha``/``limit`` of the clamped activations; 8-bit weights' scales and activation quantization)."""
    report.record(site, "fused_moe")
    out = _backend.ops().fused_moe(
        x,
        w13,
        w2,
        weights,
        ids,
        activation=activation,
        alpha=alpha,
        limit=limit,
        w13_bias=w13_bias,
        w2_bias=w2_bias,
        w13_scale=w13_scale,
        w2_scale=w2_scale,
        act_quant=act_quant,
        act_scale_fmt=act_scale_fmt,
    )
    return _fresh(out, x)


@fused_moe.register_fake
def _(
    x,
    w13,
    w2,
    weights,
    ids,
    activation,
    site,
    w13_bias=None,
    w2_bias=None,
    alpha=1.702,
    limit=None,
    w13_scale=None,
    w2_scale=None,
    act_quant=None,
    act_scale_fmt="float",
):
    return torch.empty_like(x)
