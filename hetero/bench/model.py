"""The byte and flop model of every op: what an ideal kernel must move and compute for given inputs.

Conventions (the same for every backend, so achieved GB/s and TFLOP/s compare):

- bytes: every input an ideal kernel needs is read once and every output written
  once, in the tensors' own dtypes; intermediates of a fused op are free. Only
  what the op touches counts: the KV positions some query can see (not the whole
  cache), the slots that are not -1, the experts that received tokens.
- flops: a multiply and an add are two flops; a transcendental (exp, tanh) or a
  division is one. GEMM-like work dominates where there is any; pure data
  movement (write_kv, moe_permute, ep_dispatch) has 0 flops.
- attention: 2 * visible (query, key) pairs * heads * (D + Dv); the pairs follow
  the causal, window and query/KV-length rules of ``hetero.spec.attention``.

:func:`work` takes an op's arguments by parameter name, as a conformance case's
``inputs(seed)`` returns them (host metadata is read once, before any timing).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from hetero.bench._attention_work import ATTENTION_MODELS
from hetero.bench._compress_work import kv_compress_work
from hetero.bench._compressed_attention import compressed_attention_work
from hetero.bench._work import Work, attention_pairs, elem_size, nbytes
from hetero.spec import OPS

__all__ = ["Work", "work", "attention_pairs"]


def _gemm(a: Mapping[str, Any]) -> Work:
    x, w, bias = a["a"], a["b"], a["bias"]
    m, k = x.shape
    n = w.shape[0]
    out_es = elem_size(a["out_dtype"] or x.dtype)
    packed = nbytes(a["b_scale"]) + nbytes(a["b_zero_point"])  # spec 1.9: w is int4 packed, two a byte
    return Work(
        2.0 * m * n * k + (m * n if bias is not None else 0),
        nbytes(x) + nbytes(w) + packed + nbytes(bias) + m * n * out_es,
    )


def _scaled_gemm(a: Mapping[str, Any]) -> Work:
    x, w = a["a"], a["b"]
    m, k = x.shape
    n = w.shape[0]
    scales = nbytes(a["a_scale"]) + nbytes(a["b_scale"]) + nbytes(a["bias"])
    return Work(2.0 * m * n * k, nbytes(x) + nbytes(w) + scales + m * n * elem_size(a["out_dtype"]))


def _grouped_gemm(a: Mapping[str, Any]) -> Work:
    x, w, ends = a["a"], a["b"], a["group_ends"]
    m, k = x.shape
    n = w.shape[1]
    counts = torch.diff(ends.to(torch.int64), prepend=ends.new_zeros(1, dtype=torch.int64))
    rows, used = int(ends[-1]) if ends.numel() else 0, int((counts > 0).sum())
    per_expert = [t for t in (w, a["b_scale"], a["b_zero_point"]) if t is not None]  # packed int4: spec 1.9
    weights = used * sum(t[0].numel() * t.element_size() for t in per_expert) if w.shape[0] else 0
    read = rows * k * x.element_size() + weights + nbytes(ends)
    return Work(2.0 * rows * n * k, read + m * n * elem_size(a["out_dtype"] or x.dtype))


def _quantize_activation(a: Mapping[str, Any]) -> Work:
    """Per element: |x|, a max, a division, a clamp and a rounding; per group a division. Reads x,
    writes q and the scales (and zero points)."""
    x = a["x"]
    m, k = x.shape
    groups = 1 if a["group_size"] is None else -(-k // int(a["group_size"]))
    written = m * k * elem_size(a["dtype"]) + m * groups * 4 * (2 if a["asymmetric"] else 1)
    return Work(4.0 * m * k + m * groups, nbytes(x) + written)


def _scaled_grouped_gemm(a: Mapping[str, Any]) -> Work:
    """grouped_gemm's work on the quantized operands, plus the scales of the rows and experts used."""
    x, w, ends, b_scale = a["a"], a["b"], a["group_ends"], a["b_scale"]
    m, k = x.shape
    n = w.shape[1]
    counts = torch.diff(ends.to(torch.int64), prepend=ends.new_zeros(1, dtype=torch.int64))
    rows, used = int(ends[-1]) if ends.numel() else 0, int((counts > 0).sum())
    per_expert = b_scale[0].numel() * b_scale.element_size() if b_scale.shape[0] else 0
    scales = nbytes(a["a_scale"]) + used * per_expert + nbytes(a["a_zero_point"])
    read = rows * k * x.element_size() + used * n * k * w.element_size() + nbytes(ends) + scales
    return Work(2.0 * rows * n * k, read + m * n * elem_size(a["out_dtype"]))


def _route(a: Mapping[str, Any]) -> Work:
    logits = a["router_logits"]
    m = logits.shape[0]
    read = nbytes(logits) + nbytes(a["correction_bias"]) + nbytes(a["fixed_ids"])  # fixed_ids: spec 1.8
    return Work(3.0 * logits.numel(), read + m * a["top_k"] * (4 + 4))


def _moe_permute(a: Mapping[str, Any]) -> Work:
    x, ids = a["x"], a["ids"]
    pairs = ids.numel()
    written = pairs * x.shape[1] * x.element_size() + a["num_experts"] * 4 + pairs * 8
    return Work(0.0, nbytes(x) + nbytes(ids) + written)


def _moe_unpermute(a: Mapping[str, Any]) -> Work:
    y, weights = a["y_sorted"], a["weights"]
    m, h = weights.shape[0], y.shape[1]
    return Work(2.0 * y.numel(), nbytes(y) + nbytes(a["perm"]) + nbytes(weights) + m * h * y.element_size())


def _fused_moe(a: Mapping[str, Any]) -> Work:
    x, w13, w2, ids = a["x"], a["w13"], a["w2"], a["ids"]
    m, h = x.shape
    inter = w13.shape[1] // 2  # not w2.shape[2]: packed int4 experts hold ceil(I/2) bytes a row
    pairs = ids.numel()
    experts = int(torch.unique(ids).numel()) if pairs else 0
    flops = 2.0 * pairs * h * 2 * inter + 2.0 * pairs * inter * h + 4.0 * pairs * inter + 2.0 * pairs * h
    weights = experts * (w13[0].numel() * w13.element_size() + w2[0].numel() * w2.element_size())
    extras = (a["w13_bias"], a["w2_bias"], a["w13_scale"], a["w2_scale"], a["w13_zero_point"], a["w2_zero_point"])
    biases = experts * sum(b[0].numel() * b.element_size() for b in extras if b is not None)
    return Work(flops, nbytes(x) + weights + biases + nbytes(a["weights"]) + nbytes(ids) + nbytes(x))


def _ep_dispatch(a: Mapping[str, Any]) -> Work:
    return Work(0.0, nbytes(a["x"]) + nbytes(a["ids"]) + nbytes(a["weights"]))


def _ep_combine(a: Mapping[str, Any]) -> Work:
    y, d = a["y_local"], a["dispatch"]
    return Work(2.0 * y.numel(), nbytes(y) + nbytes(d.weights) + d.num_tokens * y.shape[1] * y.element_size())


def _rms_norm(a: Mapping[str, Any]) -> Work:
    x, residual = a["x"], a["residual"]
    flops = 4.0 * x.numel() + (x.numel() if residual is not None else 0)
    written = nbytes(x) * (2 if residual is not None else 1)
    return Work(flops, nbytes(x) + nbytes(a["weight"]) + nbytes(residual) + written)


def _layer_norm(a: Mapping[str, Any]) -> Work:
    x = a["x"]
    return Work(7.0 * x.numel(), 2 * nbytes(x) + nbytes(a["weight"]) + nbytes(a["bias"]))


def _rotary_embedding(a: Mapping[str, Any]) -> Work:
    q, k, cache, pos = a["q"], a["k"], a["cos_sin_cache"], a["positions"]
    rot = cache.shape[1]
    rotated = pos.numel() * (q.shape[1] + k.shape[1]) * rot
    table = min(pos.numel(), cache.shape[0]) * rot * cache.element_size()
    return Work(3.0 * rotated, 2 * (nbytes(q) + nbytes(k)) + nbytes(pos) + table)


def _silu_and_mul(a: Mapping[str, Any]) -> Work:
    x = a["x"]
    return Work(4.0 * x.numel() / 2, nbytes(x) + nbytes(x) // 2)


def _live_sequences(a: Mapping[str, Any]) -> tuple[int, int, int]:
    """(rows, states written, sequences with an initial state) of the sequences a recurrent op runs:
    slot -1 and empty sequences read and write no state. Per-token slots [N, M] (spec 1.11): a state
    written per row whose entry is not -1."""
    cu, slots, initial = a["query_start_loc"].tolist(), a["state_slots"].tolist(), a["has_initial_state"].tolist()
    per_token = a["state_slots"].ndim == 2
    rows = slots if per_token else [[s] for s in slots]
    live = [(cu[n + 1] - cu[n], initial[n], r) for n, r in enumerate(rows) if r[0] >= 0 and cu[n + 1] > cu[n]]
    writes = sum(sum(p >= 0 for p in r[:n]) for n, _, r in live) if per_token else len(live)
    return sum(n for n, _, _ in live), writes, sum(1 for _, i, _ in live if i)


def _index_bytes(a: Mapping[str, Any]) -> int:
    index = nbytes(a["query_start_loc"]) + nbytes(a["state_slots"]) + nbytes(a["has_initial_state"])
    return index + nbytes(a.get("num_accepted_tokens"))


def _causal_conv1d(a: Mapping[str, Any]) -> Work:
    """W multiply-adds per channel and live row (+ bias, + silu's exp, add, divide); the live rows of x,
    the weight, the states read (initial state) and written (every live sequence, or per token), all of out."""
    x, weight, state = a["x"], a["weight"], a["conv_state"]
    rows, seqs, reads = _live_sequences(a)
    c, w = weight.shape
    flops = rows * c * (2.0 * w + (1 if a["bias"] is not None else 0) + (3 if a["activation"] == "silu" else 0))
    per_state = state[0].numel() * state.element_size() if state.shape[0] else 0
    moved = rows * c * x.element_size() + nbytes(weight) + nbytes(a["bias"]) + (reads + seqs) * per_state + nbytes(x)
    return Work(flops, moved + _index_bytes(a))


def _gated_delta_rule(a: Mapping[str, Any]) -> Work:
    """The recurrence per live row and value head: decay S, k^T S, the outer-product update and q^T S
    (7 K V flops), plus the l2 norms and exps; the live rows of q, k, v, g, beta, the states read and
    written, all of out. A chunked kernel does other arithmetic for the same function."""
    q, v, g, state = a["q"], a["v"], a["g"], a["ssm_state"]
    rows, seqs, reads = _live_sequences(a)
    h, k, hv, dv = q.shape[1], q.shape[2], v.shape[1], v.shape[2]
    gate = k if g.ndim == 3 else 1
    flops = rows * (hv * (7.0 * k * dv + 2 * dv + gate) + (8.0 * h * k if a["use_qk_l2norm"] else 0))
    per_state = state[0].numel() * state.element_size() if state.shape[0] else 0
    inputs = rows * (
        2 * h * k * q.element_size()
        + hv * dv * v.element_size()
        + hv * gate * g.element_size()
        + hv * a["beta"].element_size()
    )
    return Work(flops, inputs + (reads + seqs) * per_state + nbytes(v) + _index_bytes(a))


def _hc_collapse(a: Mapping[str, Any], outputs: int) -> Work:
    """hc_pre / hc_head: the M x N*D mixes per token, the norm and the collapse; the streams and fn read
    once, x and the ``outputs`` float32 weights per token written."""
    s, fn = a["streams"], a["fn"]
    t, _, d = s.shape
    flops = 2.0 * fn.numel() * t + 4.0 * s.numel()
    return Work(
        flops,
        nbytes(s) + nbytes(fn) + nbytes(a["scale"]) + nbytes(a["base"]) + t * (d * s.element_size() + 4 * outputs),
    )


def _hc_pre(a: Mapping[str, Any]) -> Work:
    n = a["streams"].shape[1]
    return _hc_collapse(a, n + (n * n if a["sinkhorn_iters"] else 0))


def _hc_post(a: Mapping[str, Any]) -> Work:
    s, comb = a["streams"], a["comb"]
    n = s.shape[1]
    return Work(
        2.0 * s.numel() * (1 + (n if comb is not None else 0)),
        nbytes(a["y"]) + 2 * nbytes(s) + nbytes(a["post"]) + nbytes(comb),
    )


def _rejection_sample(a: Mapping[str, Any]) -> Work:
    """The target (and draft) probabilities read once, a few flops each; ids in, the [B, k+1] tokens out."""
    p, q, b = a["target_probs"], a["draft_probs"], a["bonus_token_ids"].numel()
    ids = nbytes(a["draft_token_ids"]) + nbytes(a["cu_num_draft_tokens"]) + 4 * b * (a["max_spec_len"] + 2)
    return Work(6.0 * p.numel() * (1 if q is None else 2), nbytes(p) + nbytes(q) + ids)


_MODELS: dict[str, Callable[[Mapping[str, Any]], Work]] = {
    **ATTENTION_MODELS,
    "gemm": _gemm,
    "scaled_gemm": _scaled_gemm,
    "grouped_gemm": _grouped_gemm,
    "quantize_activation": _quantize_activation,
    "scaled_grouped_gemm": _scaled_grouped_gemm,
    "route": _route,
    "moe_permute": _moe_permute,
    "moe_unpermute": _moe_unpermute,
    "fused_moe": _fused_moe,
    "ep_dispatch": _ep_dispatch,
    "ep_combine": _ep_combine,
    "rms_norm": _rms_norm,
    "layer_norm": _layer_norm,
    "rotary_embedding": _rotary_embedding,
    "silu_and_mul": _silu_and_mul,
    "causal_conv1d": _causal_conv1d,
    "gated_delta_rule": _gated_delta_rule,
    "hc_pre": _hc_pre,
    "hc_post": _hc_post,
    "hc_head": lambda a: _hc_collapse(a, 0),
    "kv_compress": kv_compress_work,  # spec 1.8: hetero.bench._compress_work
    "compressed_attention": compressed_attention_work,  # spec 1.8: hetero.bench._compressed_attention
    "rejection_sample": _rejection_sample,  # spec 1.10
}


def work(op: str, inputs: Mapping[str, Any]) -> Work:
    """The flops and bytes of one call of ``op`` on ``inputs`` (arguments by parameter name)."""
    if op not in _MODELS:
        raise KeyError(f"no byte/flop model for op '{op}'")
    bound = OPS[op].signature.bind(**inputs)
    bound.apply_defaults()
    return _MODELS[op](bound.arguments)
