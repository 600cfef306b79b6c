"""Performance shapes for ``hetero bench``: one or more cases per op, drawn by the conformance catalog's
input builders (``hetero.verify.inputs``).

Two tiers. ``quick`` (float32, the fp8 scaled GEMM excepted) is sized so the
CPU reference runs each case in about 1-50 ms on a 2-core machine: head dims,
head counts, hidden sizes and expert shapes stay real, token counts, context
lengths and expert counts shrink (the name says what), and no output reaches
32 MiB: glibc serves a block that large by a fresh mmap each call, so its page
faults would dominate the timing and come and go with the heap's history (a
32 MiB moe_permute took 3.5 or 15 ms from one run to the next). ``full`` (bfloat16) is
what a GPU runs in production: decode batch 64 at 4k context, 4k-token prefill,
Qwen3-8B and DeepSeek-V3 projections, 128- and 256-expert MoE (DeepSeek-V4's routers too), DeepSeek-V3's
fp8 GEMM with 128-block scales, Qwen3-Next's linear-attention ops at decode batch
64 and a 4k prefill, DeepSeek-V3.2's indexer and sparse MLA at decode batch 64
over 4k keys, DeepSeek-V4's and HY4's hyper-connections at 4k tokens, DeepSeek-V4's KV compressors at decode
batch 64 and a 4k chunk, packed int4 (W4A16) GEMMs and experts at Kimi-K2's and Qwen3-30B-A3B's shapes
(``hetero.bench._perf_int4``). Never run ``full`` on a CPU in tests: drawing its inputs alone takes gigabytes.

The ep_* ops have no case here: they need several ranks (see
``hetero conformance --world-size``). Case shapes start with ``perf/`` so a
benchmark metric name (the case id) never collides with a conformance case.
The attention families' builders (attention, MLA, DSA) are in ``hetero.bench._perf_attention``.
"""

from __future__ import annotations

from typing import Any, Callable

from hetero.bench._compressed_attention import compressed_attention_cases
from hetero.bench._perf_attention import attention_cases, dsa_cases, mla_cases
from hetero.bench._perf_int4 import int4_cases
from hetero.bench._perf_sampling import sampling_cases
from hetero.spec import OPS
from hetero.verify.case import Case
from hetero.verify.inputs import compress as _compress
from hetero.verify.inputs import fused_moe as _fused_moe
from hetero.verify.inputs import gemm as _gemm
from hetero.verify.inputs import hyper as _hyper
from hetero.verify.inputs import layers as _layers
from hetero.verify.inputs import moe as _moe
from hetero.verify.inputs import quant as _quant
from hetero.verify.inputs import recurrent as _rec
from hetero.verify.inputs.recurrent_draw import LINEAR
from hetero.verify.shapes import MODELS

__all__ = ["TIERS", "UNBENCHED", "perf_cases"]

TIERS = ("quick", "full")
#: Ops without performance cases, with the reason the report gives: the collectives.
UNBENCHED = {
    op: "needs several ranks: benchmark it under torchrun (hetero conformance --world-size checks it)"
    for op, spec in OPS.items()
    if spec.collective
}

_Add = Callable[..., None]


def _gemms(add: _Add, full: bool, dt: str) -> None:
    q8, ds = MODELS["qwen3-8b"], MODELS["deepseek-v3"]
    qkv = (q8.heads + 2 * q8.kv_heads) * q8.head_dim
    rows = (
        [  # (shape, m, n, k)
            ("qwen3-8b-qkv-prefill-t4096", 4096, qkv, q8.hidden),
            ("qwen3-8b-down-decode-t64", 64, q8.hidden, q8.intermediate),
            ("deepseek-v3-q-b-prefill-t4096", 4096, ds.heads * (ds.qk_nope_head_dim + ds.qk_rope_head_dim), 1536),
        ]
        if full
        else [("qwen3-8b-o-proj-t16", 16, q8.hidden, q8.heads * q8.head_dim)]
    )
    for shape, m, n, k in rows:
        add("gemm", shape, _gemm.gemm(m, n, k), {"dtype": dt, "n": n, "k": k, "bias": False})
    m, n, k = (4096, ds.intermediate, ds.hidden) if full else (16, 1024, ds.hidden)
    add(
        "scaled_gemm",
        f"deepseek-v3-{'gate' if full else 'gate-n1024'}-block-fp8-t{m}",
        _gemm.scaled(m, n, k, "block", "block"),
        {
            "dtype": "float8_e4m3fn",
            "quant": "fp8",
            "n": n,
            "k": k,
            "a_scale": "block",
            "b_scale": "block",
            "block_scale": True,
            "bias": False,
            "out_dtype": "bfloat16",
        },
        dtype="float8_e4m3fn",
    )
    qm = MODELS["qwen3-30b-a3b"]
    g, tokens = (qm.experts, 4096) if full else (qm.experts // 8, 16)
    add(
        "grouped_gemm",
        f"qwen3-30b-a3b-down-g{g}-t{tokens}",
        _gemm.grouped(tokens * qm.top_k, g, qm.hidden, qm.moe_intermediate),
        {"dtype": dt, "num_experts": g, "n": qm.hidden, "k": qm.moe_intermediate},
    )


def _quant_ops(add: _Add, full: bool, dt: str) -> None:
    """DeepSeek-V3's fp8 MoE experts: the 1x128 activation quantization and the block-scaled grouped
    GEMM (quick: 16 local experts, N 512; full: 4096 tokens over 32 experts of EP 8, the real gate_up)."""
    ds = MODELS["deepseek-v3"]
    t = 4096 if full else 64
    add(
        "quantize_activation",
        f"deepseek-v3-hidden-g128-fp8-t{t}",
        _quant.quantize(t, ds.hidden, _quant.FP8, 128),
        {
            "dtype": dt,
            "quant_dtype": "float8_e4m3fn",
            "k": ds.hidden,
            "group_size": 128,
            "scale_fmt": "float",
            "asymmetric": False,
        },
    )
    g, rows, n = (ds.experts // 8, 4096 * ds.top_k // 8, 2 * ds.moe_intermediate) if full else (16, 64, 512)
    add(
        "scaled_grouped_gemm",
        f"deepseek-v3-gate-up-block-fp8-g{g}-n{n}-t{rows}",
        _quant.grouped(rows, g, n, ds.hidden, "block", "block"),
        {
            "dtype": "float8_e4m3fn",
            "num_experts": g,
            "n": n,
            "k": ds.hidden,
            "a_scale": "block",
            "b_scale": "block",
            "a_zero_point": False,
            "out_dtype": "bfloat16",
        },
        dtype="float8_e4m3fn",
    )


def _route_static(dt: str, e: int, k: int, **extra: Any) -> dict[str, Any]:
    return {
        "dtype": dt,
        "num_experts": e,
        "top_k": k,
        "scoring": "softmax",
        "n_group": 1,
        "topk_group": 1,
        "renormalize": True,
        "correction_bias": False,
        **extra,
    }


def _moe_ops(add: _Add, full: bool, dt: str) -> None:
    qm, ds = MODELS["qwen3-30b-a3b"], MODELS["deepseek-v3"]
    t = 4096 if full else 512
    add("route", f"qwen3-30b-a3b-t{t}", _moe.route(t, qm.experts, qm.top_k), _route_static(dt, qm.experts, qm.top_k))
    if full:
        add(
            "route",
            f"deepseek-v3-t{t}",
            _moe.route(
                t,
                ds.experts,
                ds.top_k,
                scoring="sigmoid",
                n_group=ds.n_group,
                topk_group=ds.topk_group,
                bias="small",
                factor=2.5,
                shift=(-1.5, 0.5),
            ),
            _route_static(
                dt,
                ds.experts,
                ds.top_k,
                scoring="sigmoid",
                n_group=ds.n_group,
                topk_group=ds.topk_group,
                correction_bias=True,
            ),
        )
    for hashed in (False, True):  # DeepSeek-V4-Flash (spec 1.8): sqrtsoftplus with its bias, and hash routing
        v4 = dict(scoring="sqrtsoftplus", factor=1.5, **({"fixed": True} if hashed else {"bias": "small"}))
        extra = {"fixed_ids": True} if hashed else {"correction_bias": True}
        name = f"deepseek-v4-flash{'-hash' if hashed else ''}-t{t}"
        add("route", name, _moe.route(t, 256, 6, **v4), _route_static(dt, 256, 6, scoring="sqrtsoftplus", **extra))
    data = {"dtype": dt, "num_experts": qm.experts, "top_k": qm.top_k, "hidden": qm.hidden}
    t = t if full else 256  # the [T * top_k, hidden] rows stay at 16 MiB (see the module docstring)
    add("moe_permute", f"qwen3-30b-a3b-t{t}", _moe.permute(t, qm.experts, qm.top_k, qm.hidden, ()), data)
    add("moe_unpermute", f"qwen3-30b-a3b-t{t}", _moe.unpermute(t, qm.experts, qm.top_k, qm.hidden), data)
    rows = (
        [  # (shape, model, experts, tokens, intermediate)
            ("qwen3-30b-a3b-e128-t64", qm, qm.experts, 64, qm.moe_intermediate),
            ("deepseek-v3-e256-i128-t64", ds, ds.experts, 64, 128),  # 256 x 7168 x 2048 experts would be 22 GB
        ]
        if full
        else [("qwen3-30b-a3b-e16-i256-t32", qm, 16, 32, 256)]
    )
    for shape, model, e, tokens, inter in rows:
        add(
            "fused_moe",
            shape,
            _fused_moe.fused(tokens, e, model.top_k, model.hidden, inter, ()),
            {
                "dtype": dt,
                "num_experts": e,
                "top_k": model.top_k,
                "hidden": model.hidden,
                "intermediate": inter,
                "activation": "silu",
            },
        )


def _layer_ops(add: _Add, full: bool, dt: str) -> None:
    q8 = MODELS["qwen3-8b"]
    t = 4096 if full else 256
    add(
        "rms_norm",
        f"qwen3-8b-residual-t{t}",
        _layers.rms(t, q8.hidden, True, False),
        {"dtype": dt, "hidden": q8.hidden},
    )
    add(
        "rotary_embedding",
        f"qwen3-8b-neox-t{t}",
        _layers.rotary(t, q8.heads, q8.kv_heads, q8.head_dim, q8.head_dim, True),
        {"dtype": dt, "head_dim": q8.head_dim, "rotary_dim": q8.head_dim, "is_neox": True},
    )
    add("silu_and_mul", f"qwen3-8b-t{t}", _layers.silu(t, q8.intermediate), {"dtype": dt})


def _recurrent_ops(add: _Add, full: bool, dt: str) -> None:
    """Qwen3-Next-80B-A3B's linear-attention layer: decode across a batch, and one prefill from zeros."""
    qn = LINEAR["qwen3-next-80b-a3b"]
    b = 64 if full else 8
    for op, build, static in (
        ("gated_delta_rule", _rec.gdr, _rec.gdr_static),
        ("causal_conv1d", _rec.conv, _rec.conv_static),
    ):
        add(op, f"qwen3-next-80b-a3b-decode-b{b}", build(qn, [(1, "init")] * b), static(dt, qn))
    add(
        "gated_delta_rule",
        f"qwen3-next-80b-a3b-prefill-{'4k' if full else '64'}",
        _rec.gdr(qn, [(4096 if full else 64, "fresh")]),
        _rec.gdr_static(dt, qn),
    )
    add(
        "causal_conv1d",
        f"qwen3-next-80b-a3b-prefill-{'4k' if full else '256'}",
        _rec.conv(qn, [(4096 if full else 256, "fresh")]),
        _rec.conv_static(dt, qn),
    )


def _hyper_ops(add: _Add, full: bool, dt: str) -> None:
    """DeepSeek-V4's hyper-connections (4 streams of 4096, 20 Sinkhorn iterations); HY4's hc_pre (2816)."""
    t, n = (4096 if full else 64), 4
    add("hc_pre", f"deepseek-v4-t{t}", _hyper.hc_pre(t, n, 4096, sinkhorn_iters=20), {"dtype": dt, "hidden": 4096})
    add("hc_pre", f"hy4-t{t}", _hyper.hc_pre(t, n, 2816, post_eps=1e-6, norm_eps=1e-5), {"dtype": dt, "hidden": 2816})
    add("hc_post", f"deepseek-v4-t{t}", _hyper.hc_post(t, n, 4096, comb=True), {"dtype": dt, "hidden": 4096})
    add("hc_head", f"deepseek-v4-t{t}", _hyper.hc_head(t, n, 4096), {"dtype": dt, "hidden": 4096})


def _compress_ops(add: _Add, full: bool, dt: str) -> None:
    """DeepSeek-V4's compressors (CSA m 4 D 512 with overlap, HCA m 128 D 512, the indexer's m 4 D 128): a decode
    batch closing a window each, and a prefill chunk continuing at an unaligned start."""
    b, ctx, t = (64, 4096, 4096) if full else (8, 256, 256)
    for name, d, m, overlap in (("csa", 512, 4, True), ("hca", 512, 128, False), ("indexer", 128, 4, True)):
        bsc = 64 if m == 4 else 2
        static = _compress.kv_compress_static(dt, d, m, overlap, bsc)
        for shape, seqs in ((f"decode-b{b}-ctx{ctx}", [(1, ctx - 1 + m * (i % 3)) for i in range(b)]),
                            (f"prefill-t{t}", [(t, ctx + 2)])):  # fmt: skip
            build = _compress.kv_compress(d, m, overlap, seqs, bsc=bsc)
            add("kv_compress", f"deepseek-v4-{name}-{shape}", build, static)


def perf_cases(tier: str) -> list[Case]:
    """The performance cases of ``tier`` ("quick": float32, CPU-sized; "full": bfloat16, GPU-sized)."""
    if tier not in TIERS:
        raise ValueError(f"tier must be one of {', '.join(TIERS)}, not {tier!r}")
    full = tier == "full"
    dt = "bfloat16" if full else "float32"
    out: list[Case] = []

    def add(op: str, shape: str, build: Any, static: dict[str, Any], dtype: str | None = None) -> None:
        out.append(Case(op, f"perf/{shape}", dtype or dt, build, static, quick=not full))

    families = (attention_cases, mla_cases, dsa_cases, _gemms, _quant_ops, _moe_ops, _layer_ops, _recurrent_ops)
    for family in (*families, _hyper_ops, _compress_ops, compressed_attention_cases, int4_cases, sampling_cases):
        family(add, full, dt)
    return out
