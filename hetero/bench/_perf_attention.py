"""Performance cases of the attention families for ``hetero bench`` (see ``hetero.bench.perf``): paged,
varlen and merge attention and the KV write (Qwen3-8B, DeepSeek-V3's MLA prefill), MLA decode and its
latent-KV write, and DeepSeek-V3.2's DSA layer (index-key write, indexer, sparse MLA, k_norm).

Each builder takes ``add`` (which appends one case), whether the tier is ``full``, and the tier's dtype.
"""

from __future__ import annotations

from typing import Callable

from hetero.verify.inputs import attention as _att
from hetero.verify.inputs import dsa as _dsa
from hetero.verify.inputs import layers as _layers
from hetero.verify.inputs import mla as _mla
from hetero.verify.inputs.dsa_draw import V4_CSA_RATIO
from hetero.verify.inputs.paged import heads, mla_scale
from hetero.verify.shapes import MODELS

__all__ = ["attention_cases", "dsa_cases", "mla_cases"]

_Add = Callable[..., None]


def attention_cases(add: _Add, full: bool, dt: str) -> None:
    q8, v3 = heads("qwen3-8b"), heads("deepseek-v3")
    bs = 16
    decode = [(1, 4096)] * 64 if full else [(1, 1024)] * 8
    prefill = [(4096, 4096)] if full else [(128, 128)] * 2
    dname = "decode-b64-ctx4k" if full else "decode-b8-ctx1k"
    pname = "prefill-4k" if full else "prefill-b2-128"
    for name, seqs in ((dname, decode), (pname, prefill)):
        add("paged_attention", f"qwen3-8b-{name}", _att.paged(q8, bs, seqs), _att.static_paged(dt, q8, bs, {}))
    add(
        "write_kv",
        f"qwen3-8b-{pname}",
        _att.write_kv(q8, bs, prefill, 0),
        {"dtype": dt, "head_dim": q8.d, "head_dim_v": q8.d, "block_size": bs, "num_kv_heads": q8.hkv},
    )
    dv = MODELS["deepseek-v3"].v_head_dim
    mla_prefill = [(4096, 4096)] if full else [(128, 128)]
    add(
        "varlen_attention",
        f"deepseek-v3-mla-prefill-{'4k' if full else '128'}",
        _att.varlen(v3, mla_prefill, dv=dv, scale=mla_scale("deepseek-v3")),
        {
            "dtype": dt,
            "head_dim": v3.d,
            "head_dim_v": dv,
            "num_heads": v3.hq,
            "num_kv_heads": v3.hkv,
            "causal": True,
            "window": (-1, -1),
            "softcap": 0.0,
        },
    )
    t = 4096 if full else 256
    add(
        "merge_attention",
        f"deepseek-v3-mla-prefill-t{t}",
        _att.merge(t, v3.hq, dv),
        {"dtype": dt, "head_dim": dv, "num_heads": v3.hq},
    )


def mla_cases(add: _Add, full: bool, dt: str) -> None:
    bs = 64
    decode = [(1, 4096)] * 64 if full else [(1, 1024)] * 2
    add(
        "mla_attention",
        "deepseek-v3-decode-b64-ctx4k" if full else "deepseek-v3-decode-b2-ctx1k",
        _mla.mla("deepseek-v3", bs, decode),
        _mla.static(dt, "deepseek-v3", bs),
    )
    tokens = [(4096, 4096)] if full else [(512, 512)]
    add(
        "write_mla_kv",
        f"deepseek-v3-prefill-{'4k' if full else '512'}",
        _mla.write_mla_kv("deepseek-v3", bs, tokens, 0),
        _mla.static(dt, "deepseek-v3", bs),
    )


def dsa_cases(add: _Add, full: bool, dt: str) -> None:
    """DeepSeek-V3.2's DSA layer: the index-key write of a prefill, the indexer and sparse MLA at decode
    (top-k 2048 of 4k keys; quick: of 2.1k, MLA with one tp8 rank's 16 heads), the indexer's k_norm; and
    DeepSeek-V4's CSA indexer at the same decode (top-512 of ctx // 4 compressed entries, spec 1.8)."""
    bs, v32 = 64, _dsa.V32
    b, ctx = (64, 4096) if full else (2, 2100)
    tokens = [(4096, 4096)] if full else [(512, 512)]
    add(
        "write_index_k",
        f"deepseek-v3.2-prefill-{tokens[0][0]}",
        _dsa.write(v32, bs, tokens, 0),
        {"dtype": dt, "head_dim": v32.d, "block_size": bs, "index_scale": False},
    )
    add(
        "indexer_topk",
        f"deepseek-v3.2-decode-b{b}-ctx{ctx}",
        _dsa.indexer(v32, bs, [(1, ctx)] * b),
        {"dtype": dt, "num_heads": v32.hi, "head_dim": v32.d, "block_size": bs, "topk": v32.topk, "index_scale": False},
    )
    m = v32 if full else _dsa.V32_TP8
    add(
        "mla_attention",
        f"deepseek-v3.2-{'' if full else 'tp8-'}sparse-decode-b{b}-ctx{ctx}-k2048",
        _dsa.sparse(m, bs, [(1, ctx)] * b, v32.topk),
        {
            "dtype": dt,
            "head_dim": m.lkv + m.rope,
            "head_dim_v": m.lkv,
            "kv_lora_rank": m.lkv,
            "qk_rope_head_dim": m.rope,
            "num_heads": m.heads,
            "block_size": bs,
            "topk_indices": True,
            "topk": v32.topk,
        },
    )
    v4, m = _dsa.V4, V4_CSA_RATIO  # DeepSeek-V4's CSA indexer (spec 1.8): top-512 of ctx // 4 compressed entries
    add(
        "indexer_topk",
        f"deepseek-v4-csa-decode-b{b}-ctx{ctx}",
        _dsa.indexer(v4, bs, [(1, ctx)] * b, ratio=m),
        {"dtype": dt, "num_heads": v4.hi, "head_dim": v4.d, "block_size": bs, "topk": v4.topk, "compress_ratio": m},
    )
    t = 4096 if full else 256
    add(
        "layer_norm",
        f"deepseek-v3.2-k-norm-t{t}",
        _layers.layer_norm((t,), v32.d),
        {"dtype": dt, "hidden": v32.d, "weight_dtype": "float32", "bias": True},
    )
