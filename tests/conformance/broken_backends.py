"""Deliberately broken backends, one realistic bug each, for proving the conformance suite.

Each subclasses the reference and replaces exactly one op, so any failure on
another op would be the suite's fault. The attention bugs live in a compact,
independent paged attention (``mini_paged_attention``) whose bug-free form
must itself pass, which shows the bugs are the only difference.
"""

from __future__ import annotations

import math

import torch
from _one_op import one_op_plugin
from broken_compress import BUGS as COMPRESS_BUGS
from broken_compressed_attention import BUGS as COMPRESSED_ATTENTION_BUGS
from broken_dsa import BUGS as DSA_BUGS
from broken_hyper import BUGS as HYPER_BUGS
from broken_int4 import BUGS as INT4_BUGS
from broken_moe import BUGS as MOE_BUGS
from broken_quant import BUGS as QUANT_BUGS
from broken_recurrent import BUGS as RECURRENT_BUGS
from broken_sampling import BUGS as SAMPLING_BUGS

from hetero_cpu_ref import gemm as ref_gemm
from hetero_cpu_ref import layers as ref_layers
from hetero_cpu_ref import moe as ref_moe

__all__ = ["BUGS", "make_plugin"]

_NEG_INF = float("-inf")


def _visible(n: int, length: int, keys: int, causal: bool, window: tuple[int, int], bug: str | None) -> torch.Tensor:
    pos = torch.arange(n)[:, None] + (length - n)
    j = torch.arange(keys)[None, :]
    vis = torch.ones(n, keys, dtype=torch.bool)
    if causal:
        vis &= j <= pos + (1 if bug == "causal_off_by_one" else 0)
    if window[0] >= 0:
        vis &= j >= pos - window[0] - (1 if bug == "window_off_by_one" else 0)
    if window[1] >= 0:
        vis &= j <= pos + window[1]
    return vis


def _sequence_kv(k_cache, v_cache, table_row, length, bug):
    bs = k_cache.shape[1]
    blocks = length // bs if bug == "last_partial_block_ignored" else -(-length // bs)
    ids = list(range(blocks)) if bug == "block_table_ignored" else table_row[:blocks]
    k = k_cache[ids].flatten(0, 1)[:length]
    v = v_cache[ids].flatten(0, 1)[:length]
    return k, v


def mini_paged_attention(bug: str | None):
    """An independent paged attention; ``bug`` names the one mistake it makes (None: correct)."""

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
        t, hq, _ = query.shape
        hkv, dv = k_cache.shape[2], v_cache.shape[3]
        acc = torch.float64 if query.dtype == torch.float64 else torch.float32
        o = torch.zeros(t, hq, dv, dtype=acc, device=query.device)
        lse = torch.full((t, hq), _NEG_INF, dtype=acc, device=query.device)
        heads = torch.arange(hq) % hkv if bug == "gqa_h_mod_hkv" else torch.arange(hq) // (hq // hkv)
        qsl, lens, table = meta.query_start_loc.tolist(), meta.seq_lens.tolist(), meta.block_table.tolist()
        for b, length in enumerate(lens):
            a, e = qsl[b], qsl[b + 1]
            if a == e:
                continue
            k, v = _sequence_kv(k_cache, v_cache, table[b], length, bug)
            k, v = k[:, heads].to(acc), v[:, heads].to(acc)
            s = (
                torch.einsum("nhd,lhd->hnl", query[a:e].to(acc), k)
                * scale
                * (math.log2(math.e) if bug == "scale_wrong" else 1.0)
            )
            if softcap > 0:
                s = softcap * torch.tanh(s / softcap)
            s = s.masked_fill(~_visible(e - a, length, k.shape[0], causal, window, bug), _NEG_INF)
            l = torch.logsumexp(s, dim=-1)
            denom = l if sinks is None else torch.logaddexp(l, sinks.to(acc)[:, None])
            p = torch.exp(s - denom.masked_fill(denom == _NEG_INF, 0.0)[..., None])
            o[a:e] = torch.einsum("hnl,lhd->nhd", p, v)
            lse[a:e] = (l / math.log(2) if bug == "lse_base2" else l).T
        result = o.to(query.dtype)
        if out is not None:
            out.copy_(result)
            result = out
        return (result, lse.float()) if return_lse else result

    return staticmethod(paged_attention)


def _grouped_gemm_off_by_one(a, b, group_ends, *, out_dtype=None, **int4):
    return ref_gemm.grouped_gemm(a, b, (group_ends - 1).clamp(min=0), out_dtype=out_dtype, **int4)


def _gemm_fp16_accumulation(a, b, *, bias=None, out_dtype=None, **int4):
    if a.dtype != torch.float16 or b.dtype == torch.uint8:  # a float16 GEMM's bug: packed int4 b (1.9) is right
        return ref_gemm.gemm(a, b, bias=bias, out_dtype=out_dtype, **int4)
    acc = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float16)
    for k0 in range(0, a.shape[1], 16):  # partial sums kept in float16, as a buggy kernel's accumulator
        acc = acc + (a[:, k0 : k0 + 16].float() @ b[:, k0 : k0 + 16].float().T).half()
    out = acc.float() + (bias.float() if bias is not None else 0)
    return out.to(out_dtype or a.dtype)


def _gemm_drops_bias(a, b, *, bias=None, out_dtype=None, **int4):
    return ref_gemm.gemm(a, b, out_dtype=out_dtype, **int4)


def _route_ignores_bias(
    router_logits,
    *,
    top_k,
    scoring="softmax",
    renormalize=True,
    n_group=1,
    topk_group=1,
    correction_bias=None,
    routed_scaling_factor=1.0,
    fixed_ids=None,
):
    bias = None if correction_bias is None else torch.zeros_like(correction_bias)
    return ref_moe.route(
        router_logits,
        top_k=top_k,
        scoring=scoring,
        renormalize=renormalize,
        n_group=n_group,
        topk_group=topk_group,
        correction_bias=bias,
        routed_scaling_factor=routed_scaling_factor,
        fixed_ids=fixed_ids,
    )


def _route_no_renormalize(
    router_logits,
    *,
    top_k,
    scoring="softmax",
    renormalize=True,
    n_group=1,
    topk_group=1,
    correction_bias=None,
    routed_scaling_factor=1.0,
    fixed_ids=None,
):
    return ref_moe.route(
        router_logits,
        top_k=top_k,
        scoring=scoring,
        renormalize=False,
        n_group=n_group,
        topk_group=topk_group,
        correction_bias=correction_bias,
        routed_scaling_factor=routed_scaling_factor,
        fixed_ids=fixed_ids,
    )


def _unpermute_drops_weights(y_sorted, perm, weights):
    return ref_moe.moe_unpermute(y_sorted, perm, torch.ones_like(weights))


def _write_kv_writes_minus_one(key, value, k_cache, v_cache, slot_mapping):
    # forgets to skip slot -1: it wraps around to the very last slot of the cache
    k_cache.view(-1, *k_cache.shape[2:])[slot_mapping] = key.to(k_cache.dtype)
    v_cache.view(-1, *v_cache.shape[2:])[slot_mapping] = value.to(v_cache.dtype)


def _rms_norm_no_residual(x, weight, eps, *, residual=None, weight_offset=0.0, gate=None, gate_act="silu"):
    opts = {"weight_offset": weight_offset, "gate": gate, "gate_act": gate_act}
    if residual is None:
        return ref_layers.rms_norm(x, weight, eps, **opts)
    return ref_layers.rms_norm(x, weight, eps, **opts), (x + residual).to(x.dtype)


def _rms_norm_ignores_offset(x, weight, eps, *, residual=None, weight_offset=0.0, gate=None, gate_act="silu"):
    # reads the zero-centred weight as the weight itself: y = xn * w instead of xn * (1 + w)
    return ref_layers.rms_norm(x, weight, eps, residual=residual, gate=gate, gate_act=gate_act)


def _rms_norm_gate_first(x, weight, eps, *, residual=None, weight_offset=0.0, gate=None, gate_act="silu"):
    # gates the input, then normalizes (norm(x * silu(z)) instead of norm(x) * silu(z))
    if gate is not None:
        act = torch.sigmoid if gate_act == "sigmoid" else torch.nn.functional.silu
        x = (x.float() * act(gate.float())).to(x.dtype)
    return ref_layers.rms_norm(x, weight, eps, residual=residual, weight_offset=weight_offset)


def _rotary_wrong_layout(positions, q, k, cos_sin_cache, *, is_neox=True):
    return ref_layers.rotary_embedding(positions, q, k, cos_sin_cache, is_neox=not is_neox)


def _silu_swapped(x):
    gate, up = x.chunk(2, dim=-1)
    return ref_layers.silu_and_mul(torch.cat([up, gate], dim=-1))


#: bug name -> (the op it breaks, its implementation)
BUGS = {
    "scale_wrong": ("paged_attention", mini_paged_attention("scale_wrong")),
    "causal_off_by_one": ("paged_attention", mini_paged_attention("causal_off_by_one")),
    "gqa_h_mod_hkv": ("paged_attention", mini_paged_attention("gqa_h_mod_hkv")),
    "last_partial_block_ignored": ("paged_attention", mini_paged_attention("last_partial_block_ignored")),
    "block_table_ignored": ("paged_attention", mini_paged_attention("block_table_ignored")),
    "lse_base2": ("paged_attention", mini_paged_attention("lse_base2")),
    "window_off_by_one": ("paged_attention", mini_paged_attention("window_off_by_one")),
    "grouped_gemm_boundary_off_by_one": ("grouped_gemm", staticmethod(_grouped_gemm_off_by_one)),
    "gemm_fp16_accumulation": ("gemm", staticmethod(_gemm_fp16_accumulation)),
    "gemm_drops_bias": ("gemm", staticmethod(_gemm_drops_bias)),
    "route_ignores_correction_bias": ("route", staticmethod(_route_ignores_bias)),
    "route_not_renormalized": ("route", staticmethod(_route_no_renormalize)),
    "unpermute_drops_weights": ("moe_unpermute", staticmethod(_unpermute_drops_weights)),
    "write_kv_writes_slot_minus_one": ("write_kv", staticmethod(_write_kv_writes_minus_one)),
    "rms_norm_without_residual_add": ("rms_norm", staticmethod(_rms_norm_no_residual)),
    "rms_norm_ignores_weight_offset": ("rms_norm", staticmethod(_rms_norm_ignores_offset)),
    "rms_norm_gate_before_norm": ("rms_norm", staticmethod(_rms_norm_gate_first)),
    "rotary_wrong_half_layout": ("rotary_embedding", staticmethod(_rotary_wrong_layout)),
    "silu_and_mul_swapped_halves": ("silu_and_mul", staticmethod(_silu_swapped)),
}
BUGS.update(RECURRENT_BUGS)  # causal_conv1d and gated_delta_rule (spec 1.2): broken_recurrent.py
BUGS.update(DSA_BUGS)  # write_index_k, indexer_topk, sparse mla_attention, layer_norm (spec 1.3): broken_dsa.py
BUGS.update(MOE_BUGS)  # fused_moe's activations and biases (spec 1.3): broken_moe.py
BUGS.update(QUANT_BUGS)  # quantize_activation and scaled_grouped_gemm (spec 1.4): broken_quant.py
BUGS.update(HYPER_BUGS)  # hc_pre, hc_post, hc_head (spec 1.7): broken_hyper.py
BUGS.update(COMPRESSED_ATTENTION_BUGS)  # compressed_attention (spec 1.8): broken_compressed_attention.py
BUGS.update(COMPRESS_BUGS)  # kv_compress (spec 1.8): broken_compress.py
BUGS.update(INT4_BUGS)  # gemm and grouped_gemm on packed int4 weights (spec 1.9): broken_int4.py
BUGS.update(SAMPLING_BUGS)  # rejection_sample (spec 1.10): broken_sampling.py


def make_plugin(bug: str | None):
    """A plugin object providing backend ``broken_<bug>`` (``bug=None``: the correct mini attention)."""
    op, impl = BUGS[bug] if bug else ("paged_attention", mini_paged_attention(None))
    return one_op_plugin(f"broken_{bug or 'control'}", op, impl)
