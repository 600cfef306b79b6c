"""The benchmark cases of scripts/gpu_check.py: realistic shapes, and the bytes and flops of each for the roofline.

``benches(sizes)`` lists every op of the spec at least once. The attention family lives in
gpu_check_attention, the sizes, the Bench record and the input helpers in gpu_check_sizes;
here are gemm, MoE (gpt-oss's swigluoai experts with biases included), the layer ops,
linear attention and the hyper-connections; the quantized ops (spec 1.4) are in gpu_check_quant, kv_compress
(spec 1.8) in gpu_check_compress, compressed_attention in gpu_check_compressed_attention, the packed int4
(W4A16, spec 1.9) gemm, grouped_gemm and fused_moe in gpu_check_int4, rejection_sample (1.10) in gpu_check_sampling,
the recurrent ops' per-token state slots (1.11) in gpu_check_recurrent.
"""

from __future__ import annotations

import math

import torch
from gpu_check_attention import attention_benches
from gpu_check_compress import compress_benches
from gpu_check_compressed_attention import compressed_attention_benches
from gpu_check_int4 import int4_benches
from gpu_check_quant import quant_benches
from gpu_check_recurrent import token_benches
from gpu_check_sampling import sampling_benches
from gpu_check_sizes import BF16, FULL, SMOKE, Bench, Sizes, expert_ids, nbytes, randn

__all__ = ["Bench", "Sizes", "FULL", "SMOKE", "benches"]


def _gemm(s: Sizes) -> list[Bench]:
    n = s.gemm

    def dense(dev):
        a, b = randn((n, n), dev), randn((n, n), dev, scale=n**-0.5)
        return {"a": a, "b": b}, 2.0 * n**3, nbytes(a, b, a)

    def scaled(block: bool):
        def make(dev):
            fp8 = torch.float8_e4m3fn
            a, b = torch.randn(n, n, device=dev).to(fp8), torch.randn(n, n, device=dev).to(fp8)
            kb = math.ceil(n / 128)
            sa = torch.rand(n, kb, device=dev) + 0.5 if block else torch.tensor(0.02, device=dev)
            sb = torch.rand(kb, kb, device=dev) + 0.5 if block else torch.tensor(0.03, device=dev)
            return {"a": a, "b": b, "a_scale": sa, "b_scale": sb}, 2.0 * n**3, nbytes(a, b, sa, sb) + n * n * 2

        return make

    return [
        Bench("gemm", f"{n}x{n}x{n}", "bfloat16", dense),
        Bench("scaled_gemm", f"{n}x{n}x{n} per-tensor", "float8_e4m3fn", scaled(False)),
        Bench("scaled_gemm", f"{n}x{n}x{n} 128-blocks", "float8_e4m3fn", scaled(True)),
    ]


def _balanced_ends(rows: int, groups: int, device) -> torch.Tensor:
    counts = torch.bincount(torch.randint(0, groups, (rows,)), minlength=groups)
    return counts.cumsum(0).to(torch.int32).to(device)


def _grouped(model: str, proj: str, e: int, h: int, i: int, rows: int) -> Bench:
    n, k = (2 * i, h) if proj == "gate_up" else (h, i)

    def make(dev):
        a, b = randn((rows, k), dev), randn((e, n, k), dev, scale=k**-0.5)
        ends = _balanced_ends(rows, e, dev)
        return {"a": a, "b": b, "group_ends": ends}, 2.0 * rows * n * k, nbytes(a, b) + rows * n * 2

    return Bench("grouped_gemm", f"{model} {proj} E{e} rows{rows} N{n} K{k}", "bfloat16", make)


def _fused(model: str, e: int, k: int, h: int, i: int, tokens: int, oss: bool = False) -> Bench:
    """``oss``: gpt-oss's experts, swigluoai (alpha 1.702, limit 7) with both biases; the gate projection's
    spread (std 3) puts about 2% of the gates past the limit."""

    def make(dev):
        x = randn((tokens, h), dev)
        w13, w2 = randn((e, 2 * i, h), dev, scale=(3.0 if oss else 1.0) * h**-0.5), randn((e, h, i), dev, scale=i**-0.5)
        ids = expert_ids(tokens, e, k, dev)
        weights = torch.rand(tokens, k, device=dev)
        used = int(torch.unique(ids).numel())
        per_expert = (2 * i * h + h * i + (3 * i + h if oss else 0)) * 2
        inputs = {"x": x, "w13": w13, "w2": w2, "weights": weights, "ids": ids}
        if oss:
            inputs.update(
                activation="swigluoai",
                alpha=1.702,
                limit=7.0,
                w13_bias=randn((e, 2 * i), dev),
                w2_bias=randn((e, h), dev, scale=0.1),
            )
        return inputs, 2.0 * tokens * k * 3 * i * h, used * per_expert + 2 * nbytes(x) + nbytes(ids, weights)

    return Bench("fused_moe", f"{model} T{tokens} E{e} top{k} H{h} I{i}", "bfloat16", make)


def _moe_data(s: Sizes) -> list[Bench]:
    e, k, h, _ = s.experts["deepseek-v3"]
    t = s.tokens

    def route(dev):
        logits = torch.randn(t, e, device=dev)
        bias = torch.randn(e, device=dev) * 0.1
        groups = 8 if e % 8 == 0 else 1
        inputs = {
            "router_logits": logits,
            "top_k": k,
            "scoring": "sigmoid",
            "n_group": groups,
            "topk_group": max(1, groups // 2),
            "correction_bias": bias,
            "routed_scaling_factor": 2.5,
        }
        return inputs, 0.0, nbytes(logits, bias) + t * k * 8

    def route_v4(hashed: bool):  # DeepSeek-V4 (spec 1.8): sqrtsoftplus with its bias, or hash routing
        def make(dev):
            logits, k6 = torch.randn(t, e, device=dev), min(6, e)
            extra = (
                {"fixed_ids": torch.rand(t, e, device=dev).argsort(dim=1)[:, :k6].to(torch.int32)}
                if hashed
                else {"correction_bias": torch.randn(e, device=dev) * 0.1}
            )
            inputs = {"router_logits": logits, "top_k": k6, "scoring": "sqrtsoftplus", "routed_scaling_factor": 1.5}
            return {**inputs, **extra}, 0.0, nbytes(logits, *extra.values()) + t * k6 * 8

        return make

    def permute(dev):
        x, ids = randn((t, h), dev), expert_ids(t, e, k, dev)
        return {"x": x, "ids": ids, "num_experts": e}, 0.0, nbytes(x, ids) + (k + 0.0) * nbytes(x) + t * k * 8

    def unpermute(dev):
        ids = expert_ids(t, e, k, dev)
        y = randn((t * k, h), dev)
        perm = torch.sort(ids.reshape(-1).long(), stable=True).indices
        weights = torch.rand(t, k, device=dev)
        return {"y_sorted": y, "perm": perm, "weights": weights}, 2.0 * t * k * h, nbytes(y, perm, weights) + t * h * 2

    return [
        Bench("route", f"deepseek-v3 T{t} E{e} sigmoid grouped", "float32", route),
        Bench("route", f"deepseek-v4 T{t} E{e} sqrtsoftplus", "float32", route_v4(False)),
        Bench("route", f"deepseek-v4 T{t} E{e} hash (fixed_ids)", "float32", route_v4(True)),
        Bench("moe_permute", f"deepseek-v3 T{t} top{k} H{h}", "bfloat16", permute),
        Bench("moe_unpermute", f"deepseek-v3 T{t} top{k} H{h}", "bfloat16", unpermute),
    ]


def _layers(s: Sizes) -> list[Bench]:
    t, (h, inter), (hq, hkv, d) = s.tokens, s.layer, s.heads

    def rms(dev):
        x, res, w = randn((t, h), dev), randn((t, h), dev), randn((h,), dev)
        return {"x": x, "weight": w, "eps": 1e-6, "residual": res}, 4.0 * t * h, 4 * nbytes(x)

    def rope(dev):
        pos = torch.randint(0, 4 * t, (t,), device=dev)
        q, kk = randn((t, hq, d), dev), randn((t, hkv, d), dev)
        cache = torch.randn(4 * t, d, device=dev)
        return (
            {"positions": pos, "q": q, "k": kk, "cos_sin_cache": cache},
            6.0 * (q.numel() + kk.numel()),
            2 * nbytes(q, kk) + t * d * 4,
        )

    def silu(dev):
        x = randn((t, 2 * inter), dev)
        return {"x": x}, 4.0 * t * inter, 1.5 * nbytes(x)

    def layer(dev):  # the DSA indexer's k_norm: weight and bias kept in float32
        rows, hidden = s.norm
        x, w, b = randn((rows, hidden), dev), torch.randn(hidden, device=dev), torch.randn(hidden, device=dev)
        return {"x": x, "weight": w, "bias": b, "eps": 1e-6}, 8.0 * rows * hidden, 2 * nbytes(x) + nbytes(w, b)

    return [
        Bench("rms_norm", f"T{t} H{h} +residual", "bfloat16", rms),
        Bench("layer_norm", f"T{s.norm[0]} H{s.norm[1]} +bias (indexer k_norm)", "bfloat16", layer),
        Bench("rotary_embedding", f"T{t} Hq{hq} Hkv{hkv} D{d} neox", "bfloat16", rope),
        Bench("silu_and_mul", f"T{t} I{inter}", "bfloat16", silu),
    ]


def _state_batch(seqs: int, each: int, decode: bool, device) -> dict[str, torch.Tensor]:
    """query_start_loc, state_slots (a permutation of the slots) and has_initial_state (decode: True)."""
    return {
        "query_start_loc": torch.arange(0, seqs * each + 1, each, dtype=torch.int32, device=device),
        "state_slots": torch.randperm(seqs).to(torch.int32).to(device),
        "has_initial_state": torch.full((seqs,), decode, dtype=torch.bool, device=device),
    }


def _linear_attention(s: Sizes) -> list[Bench]:
    """causal_conv1d and gated_delta_rule (per-head g) at decode and prefill. Bytes: every input
    and output once, the state slot read (decode only: a fresh prefill has no initial state) and
    written. Flops of the delta rule: 6 K V per row and value head (k^T S, the rank-1 update,
    q^T S), plus for prefill the chunked form's intra-chunk products 4 * 64 * (K + V)."""
    h, kd, hv, vd, c, w = s.linear
    decode_b, pre_b, pre_n = s.linear_batch

    def conv(seqs: int, each: int, decode: bool):
        def make(dev):
            t = seqs * each
            x, weight, state = randn((t, c), dev), randn((c, w), dev, scale=w**-0.5), randn((seqs, w - 1, c), dev)
            inputs = {
                "x": x,
                "weight": weight,
                "bias": None,
                "conv_state": state,
                **_state_batch(seqs, each, decode, dev),
                "activation": "silu",
            }
            return inputs, 2.0 * t * c * w, 2 * nbytes(x) + nbytes(weight) + (2 if decode else 1) * nbytes(state)

        return make

    def delta(seqs: int, each: int, decode: bool):
        def make(dev):
            t = seqs * each
            q, k, v = randn((t, h, kd), dev), randn((t, h, kd), dev), randn((t, hv, vd), dev)
            g = torch.rand(t, hv, device=dev).mul_(-0.5).sub_(0.01)  # log-decays, float32
            beta = torch.rand(t, hv, device=dev).to(BF16)
            state = torch.randn(seqs, hv, kd, vd, device=dev).mul_(0.1)  # float32, 2 MiB per sequence
            inputs = {
                "q": q,
                "k": k,
                "v": v,
                "g": g,
                "beta": beta,
                "ssm_state": state,
                **_state_batch(seqs, each, decode, dev),
                "scale": kd**-0.5,
                "use_qk_l2norm": True,
            }
            flops = t * hv * (6.0 * kd * vd + (0 if decode else 4 * 64 * (kd + vd)))
            return inputs, flops, nbytes(q, k, v, g, beta, v) + (2 if decode else 1) * nbytes(state)

        return make

    heads = f"H{h} K{kd} HV{hv} V{vd}"
    return [
        Bench("causal_conv1d", f"decode B{decode_b} C{c} W{w}", "bfloat16", conv(decode_b, 1, True)),
        Bench("causal_conv1d", f"prefill {pre_b}x{pre_n} C{c} W{w}", "bfloat16", conv(pre_b, pre_n, False)),
        Bench("gated_delta_rule", f"decode B{decode_b} {heads}", "bfloat16", delta(decode_b, 1, True)),
        Bench("gated_delta_rule", f"prefill {pre_b}x{pre_n} {heads}", "bfloat16", delta(pre_b, pre_n, False)),
    ]


def _hyper(s: Sizes) -> list[Bench]:
    """hc_pre (DeepSeek-V4's Sinkhorn form and HY4's), hc_post and hc_head at T tokens. Bytes: the streams
    read once, fn once, every output written once; flops: the M x N*D mixes per token and the collapse."""
    t, (n, d) = s.tokens, s.hyper

    def params(dev, rows: int, entries: int) -> dict[str, torch.Tensor]:
        fn = torch.randn(rows, n * d, device=dev) * (n * d) ** -0.5
        return {"fn": fn, "scale": torch.rand(entries, device=dev) + 0.5, "base": torch.randn(rows, device=dev)}

    def pre(iters: int):
        def make(dev):
            rows = n * (n + 2) if iters else 2 * n
            streams, p = randn((t, n, d), dev), params(dev, rows, 3 if iters else 2)
            inputs = {"streams": streams, **p, "norm_eps": 1e-6, "hc_eps": 1e-6, "sinkhorn_iters": iters}
            out = t * d * 2 + t * (n + (n * n if iters else 0)) * 4
            return inputs, 2.0 * t * rows * n * d + 4.0 * t * n * d, nbytes(streams, *p.values()) + out

        return make

    def post(dev):
        y, streams = randn((t, d), dev), randn((t, n, d), dev)
        w, comb = torch.rand(t, n, device=dev) * 2, torch.softmax(torch.randn(t, n, n, device=dev), -1)
        inputs = {"y": y, "streams": streams, "post": w, "comb": comb}
        return inputs, 2.0 * t * n * d * (n + 1), nbytes(y, streams, w, comb) + nbytes(streams)

    def head(dev):
        streams, p = randn((t, n, d), dev), params(dev, n, 1)
        inputs = {"streams": streams, **p, "norm_eps": 1e-6, "hc_eps": 1e-6}
        return inputs, 2.0 * t * n * n * d + 4.0 * t * n * d, nbytes(streams, *p.values()) + t * d * 2

    return [
        Bench("hc_pre", f"deepseek-v4 T{t} N{n} D{d} sinkhorn20", "bfloat16", pre(20)),
        Bench("hc_pre", f"hy4-form T{t} N{n} D{d}", "bfloat16", pre(0)),
        Bench("hc_post", f"deepseek-v4 T{t} N{n} D{d} comb", "bfloat16", post),
        Bench("hc_head", f"deepseek-v4 T{t} N{n} D{d}", "bfloat16", head),
    ]


def benches(s: Sizes) -> list[Bench]:
    """Every op of the spec at least once, in spec order."""
    out = attention_benches(s) + _gemm(s)
    for model, (e, k, h, i) in s.experts.items():
        out += [_grouped(model, "gate_up", e, h, i, s.routed_rows), _grouped(model, "down", e, h, i, s.routed_rows)]
    out += _moe_data(s)
    for model, (e, k, h, i) in s.experts.items():
        out += [_fused(model, e, k, h, i, t) for t in s.moe_tokens]
    e, k, h, i = s.oss_moe
    out += [_fused("gpt-oss-20b swigluoai+bias", e, k, h, i, t, oss=True) for t in s.moe_tokens]
    out += quant_benches(s) + _layers(s) + _linear_attention(s) + _hyper(s)
    out += compress_benches(s) + compressed_attention_benches(s)  # spec 1.8 (DeepSeek-V4)
    return out + int4_benches(s) + sampling_benches(s) + token_benches(s)  # spec 1.9: W4A16; 1.10; 1.11
