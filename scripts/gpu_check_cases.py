"""The benchmark cases of scripts/gpu_check.py: realistic shapes, and the bytes and flops of each for the roofline.

A :class:`Bench` names an op and a case; ``make(device)`` draws its inputs (bfloat16
unless said) and returns them with the flops it performs and the bytes it must
move at least (every input read once, every output written once).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from hetero.spec import AttentionMeta

__all__ = ["Bench", "Sizes", "FULL", "SMOKE", "benches"]

BF16 = torch.bfloat16


@dataclass(frozen=True)
class Sizes:
    decode: tuple[int, int]  # (sequences, KV length)
    heads: tuple[int, int, int]  # (Hq, Hkv, D)
    block: int
    prefill: tuple[int, int]  # (sequences, tokens each)
    mla: tuple[int, int, int]  # (heads, Lkv, rope dim); block size 64
    gemm: int  # M = N = K
    tokens: int  # rows of the layer ops, route and permute
    layer: tuple[int, int]  # (hidden, intermediate)
    experts: dict[str, tuple[int, int, int, int]]  # model -> (E, top_k, H, I)
    routed_rows: int  # grouped_gemm rows (tokens x top_k)
    moe_tokens: tuple[int, ...]
    linear: tuple[int, int, int, int, int, int]  # Gated DeltaNet (H, K, HV, V, conv channels C, conv width W)
    linear_batch: tuple[int, int, int]  # (decode sequences, prefill sequences, prefill tokens each)


FULL = Sizes((64, 4096), (32, 8, 128), 16, (8, 2048), (128, 512, 64), 4096, 8192, (4096, 12288),
             {"qwen3-30b-a3b": (128, 8, 2048, 768), "deepseek-v3": (256, 8, 7168, 2048)}, 32768, (1, 256),
             (16, 128, 32, 128, 8192, 4), (64, 8, 4096))  # Qwen3-Next-80B-A3B's linear-attention layers
SMOKE = Sizes((2, 40), (4, 2, 32), 16, (2, 24), (4, 64, 16), 64, 16, (64, 96),
              {"qwen3-30b-a3b": (8, 2, 64, 32), "deepseek-v3": (16, 2, 128, 64)}, 24, (1, 4),
              (2, 16, 4, 16, 64, 4), (3, 2, 40))


@dataclass(frozen=True)
class Bench:
    op: str
    case: str
    dtype: str
    make: Callable[[torch.device], tuple[dict[str, Any], float, float]]  # -> (inputs, flops, bytes)


def _nbytes(*tensors: torch.Tensor) -> float:
    return float(sum(t.numel() * t.element_size() for t in tensors))


def _randn(shape, device, dtype=BF16, scale=1.0) -> torch.Tensor:
    return torch.randn(shape, device=device, dtype=dtype).mul_(scale)  # drawn in bf16: no fp32 copy of 15 GB weights


def _paged_meta(qlens: list[int], kvlens: list[int], bs: int, device) -> tuple[AttentionMeta, int]:
    """A meta whose sequences own random, non-contiguous blocks; returns (meta, number of blocks)."""
    need = [math.ceil(n / bs) for n in kvlens]
    perm = torch.randperm(sum(need)).tolist()
    width, rows, at = max(need), [], 0
    for n in need:
        rows.append(perm[at:at + n] + [0] * (width - n))
        at += n
    return AttentionMeta.build(qlens, kvlens, rows, device=device), sum(need)


def _visible(n: int, length: int) -> int:
    """Keys seen by n causal query rows at the end of a sequence of ``length``."""
    return n * length - n * (n - 1) // 2


def _paged(case: str, qlens: list[int], kvlens: list[int], s: Sizes) -> Bench:
    hq, hkv, d = s.heads

    def make(dev):
        meta, nblk = _paged_meta(qlens, kvlens, s.block, dev)
        q = _randn((sum(qlens), hq, d), dev)
        kc, vc = _randn((nblk, s.block, hkv, d), dev), _randn((nblk, s.block, hkv, d), dev)
        seen = sum(_visible(n, L) for n, L in zip(qlens, kvlens))
        inputs = {"query": q, "k_cache": kc, "v_cache": vc, "meta": meta, "scale": d ** -0.5, "causal": True}
        return inputs, 4.0 * hq * d * seen, 2 * _nbytes(q) + sum(kvlens) * hkv * 2 * d * 2

    return Bench("paged_attention", case, "bfloat16", make)


def _varlen(s: Sizes) -> Bench:
    (b, n), (hq, hkv, d) = s.prefill, s.heads

    def make(dev):
        q, k, v = _randn((b * n, hq, d), dev), _randn((b * n, hkv, d), dev), _randn((b * n, hkv, d), dev)
        cu = torch.arange(0, b * n + 1, n, dtype=torch.int32, device=dev)
        inputs = {"query": q, "key": k, "value": v, "cu_seqlens_q": cu, "cu_seqlens_k": cu, "max_seqlen_q": n,
                  "max_seqlen_k": n, "scale": d ** -0.5, "causal": True}
        return inputs, 4.0 * hq * d * b * _visible(n, n), _nbytes(q, k, v, q)

    return Bench("varlen_attention", f"prefill {b}x{n} Hq{hq} Hkv{hkv} D{d}", "bfloat16", make)


def _write_kv(s: Sizes) -> Bench:
    (b, n), (hq, hkv, d) = s.prefill, s.heads

    def make(dev):
        t = b * n
        k, v = _randn((t, hkv, d), dev), _randn((t, hkv, d), dev)
        nblk = math.ceil(t / s.block)
        kc, vc = _randn((nblk, s.block, hkv, d), dev), _randn((nblk, s.block, hkv, d), dev)
        slots = torch.arange(t, dtype=torch.int64, device=dev)
        return {"key": k, "value": v, "k_cache": kc, "v_cache": vc, "slot_mapping": slots}, 0.0, 2 * _nbytes(k, v) + _nbytes(slots)

    return Bench("write_kv", f"prefill {b}x{n} Hkv{hkv} D{d} bs{s.block}", "bfloat16", make)


def _mla(s: Sizes) -> list[Bench]:
    (b, length), (h, lkv, r) = s.decode, s.mla

    def attend(dev):
        meta, nblk = _paged_meta([1] * b, [length] * b, 64, dev)
        qn, qp = _randn((b, h, lkv), dev), _randn((b, h, r), dev)
        ckv, kpe = _randn((nblk, 64, lkv), dev), _randn((nblk, 64, r), dev)
        inputs = {"q_nope": qn, "q_pe": qp, "ckv_cache": ckv, "kpe_cache": kpe, "meta": meta, "scale": 192 ** -0.5}
        return inputs, 2.0 * h * b * length * (2 * lkv + r), _nbytes(qn, qp, qn) + b * length * (lkv + r) * 2

    def write(dev):
        t = b
        kv_c, k_pe = _randn((t, lkv), dev), _randn((t, r), dev)
        ckv, kpe = _randn((t, 64, lkv), dev), _randn((t, 64, r), dev)
        slots = torch.arange(t, dtype=torch.int64, device=dev) * 64 + (length - 1) % 64
        return {"kv_c": kv_c, "k_pe": k_pe, "ckv_cache": ckv, "kpe_cache": kpe, "slot_mapping": slots}, 0.0, 2 * _nbytes(kv_c, k_pe)

    return [Bench("write_mla_kv", f"decode B{b} Lkv{lkv} R{r}", "bfloat16", write),
            Bench("mla_attention", f"decode B{b} KV{length} H{h} Lkv{lkv} R{r} bs64", "bfloat16", attend)]


def _merge(s: Sizes) -> Bench:
    hq, _, d = s.heads

    def make(dev):
        t = s.tokens
        oa, ob = _randn((t, hq, d), dev), _randn((t, hq, d), dev)
        la, lb = torch.randn(t, hq, device=dev), torch.randn(t, hq, device=dev)
        return {"out_a": oa, "lse_a": la, "out_b": ob, "lse_b": lb}, 0.0, _nbytes(oa, ob, oa, la, lb, la)

    return Bench("merge_attention", f"T{s.tokens} H{hq} D{d}", "bfloat16", make)


def _gemm(s: Sizes) -> list[Bench]:
    n = s.gemm

    def dense(dev):
        a, b = _randn((n, n), dev), _randn((n, n), dev, scale=n ** -0.5)
        return {"a": a, "b": b}, 2.0 * n ** 3, _nbytes(a, b, a)

    def scaled(block: bool):
        def make(dev):
            fp8 = torch.float8_e4m3fn
            a, b = torch.randn(n, n, device=dev).to(fp8), torch.randn(n, n, device=dev).to(fp8)
            kb = math.ceil(n / 128)
            sa = torch.rand(n, kb, device=dev) + 0.5 if block else torch.tensor(0.02, device=dev)
            sb = torch.rand(kb, kb, device=dev) + 0.5 if block else torch.tensor(0.03, device=dev)
            return {"a": a, "b": b, "a_scale": sa, "b_scale": sb}, 2.0 * n ** 3, _nbytes(a, b, sa, sb) + n * n * 2

        return make

    return [Bench("gemm", f"{n}x{n}x{n}", "bfloat16", dense),
            Bench("scaled_gemm", f"{n}x{n}x{n} per-tensor", "float8_e4m3fn", scaled(False)),
            Bench("scaled_gemm", f"{n}x{n}x{n} 128-blocks", "float8_e4m3fn", scaled(True))]


def _balanced_ends(rows: int, groups: int, device) -> torch.Tensor:
    counts = torch.bincount(torch.randint(0, groups, (rows,)), minlength=groups)
    return counts.cumsum(0).to(torch.int32).to(device)


def _grouped(model: str, proj: str, e: int, h: int, i: int, rows: int) -> Bench:
    n, k = (2 * i, h) if proj == "gate_up" else (h, i)

    def make(dev):
        a, b = _randn((rows, k), dev), _randn((e, n, k), dev, scale=k ** -0.5)
        ends = _balanced_ends(rows, e, dev)
        return {"a": a, "b": b, "group_ends": ends}, 2.0 * rows * n * k, _nbytes(a, b) + rows * n * 2

    return Bench("grouped_gemm", f"{model} {proj} E{e} rows{rows} N{n} K{k}", "bfloat16", make)


def _ids(tokens: int, e: int, k: int, device) -> torch.Tensor:
    return torch.rand(tokens, e).topk(k, dim=1).indices.to(torch.int32).to(device)


def _fused(model: str, e: int, k: int, h: int, i: int, tokens: int) -> Bench:
    def make(dev):
        x = _randn((tokens, h), dev)
        w13, w2 = _randn((e, 2 * i, h), dev, scale=h ** -0.5), _randn((e, h, i), dev, scale=i ** -0.5)
        ids = _ids(tokens, e, k, dev)
        weights = torch.rand(tokens, k, device=dev)
        used = int(torch.unique(ids).numel())
        per_expert = (2 * i * h + h * i) * 2
        inputs = {"x": x, "w13": w13, "w2": w2, "weights": weights, "ids": ids}
        return inputs, 2.0 * tokens * k * 3 * i * h, used * per_expert + 2 * _nbytes(x) + _nbytes(ids, weights)

    return Bench("fused_moe", f"{model} T{tokens} E{e} top{k} H{h} I{i}", "bfloat16", make)


def _moe_data(s: Sizes) -> list[Bench]:
    e, k, h, _ = s.experts["deepseek-v3"]
    t = s.tokens

    def route(dev):
        logits = torch.randn(t, e, device=dev)
        bias = torch.randn(e, device=dev) * 0.1
        groups = 8 if e % 8 == 0 else 1
        inputs = {"router_logits": logits, "top_k": k, "scoring": "sigmoid", "n_group": groups, "topk_group": max(1, groups // 2),
                  "correction_bias": bias, "routed_scaling_factor": 2.5}
        return inputs, 0.0, _nbytes(logits, bias) + t * k * 8

    def permute(dev):
        x, ids = _randn((t, h), dev), _ids(t, e, k, dev)
        return {"x": x, "ids": ids, "num_experts": e}, 0.0, _nbytes(x, ids) + (k + 0.0) * _nbytes(x) + t * k * 8

    def unpermute(dev):
        ids = _ids(t, e, k, dev)
        y = _randn((t * k, h), dev)
        perm = torch.sort(ids.reshape(-1).long(), stable=True).indices
        weights = torch.rand(t, k, device=dev)
        return {"y_sorted": y, "perm": perm, "weights": weights}, 2.0 * t * k * h, _nbytes(y, perm, weights) + t * h * 2

    return [Bench("route", f"deepseek-v3 T{t} E{e} sigmoid grouped", "float32", route),
            Bench("moe_permute", f"deepseek-v3 T{t} top{k} H{h}", "bfloat16", permute),
            Bench("moe_unpermute", f"deepseek-v3 T{t} top{k} H{h}", "bfloat16", unpermute)]


def _layers(s: Sizes) -> list[Bench]:
    t, (h, inter), (hq, hkv, d) = s.tokens, s.layer, s.heads

    def rms(dev):
        x, res, w = _randn((t, h), dev), _randn((t, h), dev), _randn((h,), dev)
        return {"x": x, "weight": w, "eps": 1e-6, "residual": res}, 4.0 * t * h, 4 * _nbytes(x)

    def rope(dev):
        pos = torch.randint(0, 4 * t, (t,), device=dev)
        q, kk = _randn((t, hq, d), dev), _randn((t, hkv, d), dev)
        cache = torch.randn(4 * t, d, device=dev)
        return {"positions": pos, "q": q, "k": kk, "cos_sin_cache": cache}, 6.0 * (q.numel() + kk.numel()), 2 * _nbytes(q, kk) + t * d * 4

    def silu(dev):
        x = _randn((t, 2 * inter), dev)
        return {"x": x}, 4.0 * t * inter, 1.5 * _nbytes(x)

    return [Bench("rms_norm", f"T{t} H{h} +residual", "bfloat16", rms),
            Bench("rotary_embedding", f"T{t} Hq{hq} Hkv{hkv} D{d} neox", "bfloat16", rope),
            Bench("silu_and_mul", f"T{t} I{inter}", "bfloat16", silu)]


def _state_batch(seqs: int, each: int, decode: bool, device) -> dict[str, torch.Tensor]:
    """query_start_loc, state_slots (a permutation of the slots) and has_initial_state (decode: True)."""
    return {"query_start_loc": torch.arange(0, seqs * each + 1, each, dtype=torch.int32, device=device),
            "state_slots": torch.randperm(seqs).to(torch.int32).to(device),
            "has_initial_state": torch.full((seqs,), decode, dtype=torch.bool, device=device)}


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
            x, weight, state = _randn((t, c), dev), _randn((c, w), dev, scale=w ** -0.5), _randn((seqs, w - 1, c), dev)
            inputs = {"x": x, "weight": weight, "bias": None, "conv_state": state, **_state_batch(seqs, each, decode, dev),
                      "activation": "silu"}
            return inputs, 2.0 * t * c * w, 2 * _nbytes(x) + _nbytes(weight) + (2 if decode else 1) * _nbytes(state)

        return make

    def delta(seqs: int, each: int, decode: bool):
        def make(dev):
            t = seqs * each
            q, k, v = _randn((t, h, kd), dev), _randn((t, h, kd), dev), _randn((t, hv, vd), dev)
            g = torch.rand(t, hv, device=dev).mul_(-0.5).sub_(0.01)  # log-decays, float32
            beta = torch.rand(t, hv, device=dev).to(BF16)
            state = torch.randn(seqs, hv, kd, vd, device=dev).mul_(0.1)  # float32, 2 MiB per sequence
            inputs = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "ssm_state": state, **_state_batch(seqs, each, decode, dev),
                      "scale": kd ** -0.5, "use_qk_l2norm": True}
            flops = t * hv * (6.0 * kd * vd + (0 if decode else 4 * 64 * (kd + vd)))
            return inputs, flops, _nbytes(q, k, v, g, beta, v) + (2 if decode else 1) * _nbytes(state)

        return make

    heads = f"H{h} K{kd} HV{hv} V{vd}"
    return [Bench("causal_conv1d", f"decode B{decode_b} C{c} W{w}", "bfloat16", conv(decode_b, 1, True)),
            Bench("causal_conv1d", f"prefill {pre_b}x{pre_n} C{c} W{w}", "bfloat16", conv(pre_b, pre_n, False)),
            Bench("gated_delta_rule", f"decode B{decode_b} {heads}", "bfloat16", delta(decode_b, 1, True)),
            Bench("gated_delta_rule", f"prefill {pre_b}x{pre_n} {heads}", "bfloat16", delta(pre_b, pre_n, False))]


def benches(s: Sizes) -> list[Bench]:
    """Every op of the spec at least once, in spec order."""
    (b, length), (pb, pn) = s.decode, s.prefill
    out = [_write_kv(s),
           _paged(f"decode B{b} KV{length} Hq{s.heads[0]} Hkv{s.heads[1]} D{s.heads[2]} bs{s.block}", [1] * b, [length] * b, s),
           _paged(f"prefill {pb}x{pn} bs{s.block}", [pn] * pb, [pn] * pb, s),
           _varlen(s), *_mla(s), _merge(s), *_gemm(s)]
    for model, (e, k, h, i) in s.experts.items():
        out += [_grouped(model, "gate_up", e, h, i, s.routed_rows), _grouped(model, "down", e, h, i, s.routed_rows)]
    out += _moe_data(s)
    for model, (e, k, h, i) in s.experts.items():
        out += [_fused(model, e, k, h, i, t) for t in s.moe_tokens]
    return out + _layers(s) + _linear_attention(s)
