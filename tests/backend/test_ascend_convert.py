"""hetero-ascend without an NPU: every hetero -> torch_npu conversion, checked on CPU.

Each ``npu_*`` function below is a small reference written from the torch_npu / CANN documentation's
stated semantics (cited in hetero_ascend.convert), not from hetero's spec. The converted arguments are
fed to it and the result is compared with hetero_cpu_ref. What these tests cannot show is that the real
operators behave as documented: none of the mapped ops has run on an NPU.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("hetero_ascend.plugin", reason="hetero-ascend is not installed (pip install -e backends/ascend)")
import hetero_cpu_ref.attention as ref_attn  # noqa: E402
import hetero_cpu_ref.gemm as ref_gemm  # noqa: E402
import hetero_cpu_ref.layers as ref_layers  # noqa: E402
import hetero_cpu_ref.moe as ref_moe  # noqa: E402
from hetero.spec import AttentionMeta  # noqa: E402
from hetero_ascend import convert as cv  # noqa: E402
from hetero_ascend.plugin import AscendBackend  # noqa: E402
from hetero_ascend.support import triton_ascend_version  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ATOL = RTOL = 1e-5


# ----------------------------------------------------------------------------- npu-semantics references


def npu_fia(
    query,
    key,
    value,
    *,
    actual_seq_lengths,
    actual_seq_lengths_kv,
    num_heads,
    num_key_value_heads,
    scale,
    sparse_mode,
    pre_tokens,
    next_tokens,
    input_layout,
    atten_mask=None,
    block_table=None,
    block_size=0,
    softmax_lse_flag=False,
    query_rope=None,
    key_rope=None,
):
    """npu_fused_infer_attention_score as documented, TND only: cumulative actual_seq_lengths; with a
    block_table per-batch KV lengths over (blocknum, blocksize, H) or (blocknum, N, blocksize, D) caches,
    else cumulative KV lengths; sparse 0 (no mask), 3 (rightDownCausal), 4 (band, right-down aligned)."""
    assert input_layout == "TND" and query.is_contiguous() and query.shape[1] == num_heads
    if sparse_mode in (3, 4):
        assert atten_mask is not None and torch.equal(
            atten_mask.cpu(), torch.ones(2048, 2048, dtype=torch.bool).triu(1)
        )
    t, n, _ = query.shape
    group = num_heads // num_key_value_heads
    out = query.new_zeros(
        t, n, value.shape[-1] if block_table is None or value.dim() == 4 else value.shape[-1] // num_key_value_heads
    )
    lse = torch.full((t, n, 1), float("-inf"), dtype=torch.float64)
    q_start = kv_start = 0
    for b, q_end in enumerate(actual_seq_lengths):
        sq = q_end - q_start
        if block_table is None:
            skv = actual_seq_lengths_kv[b] - kv_start
            k, v = key[kv_start : kv_start + skv], value[kv_start : kv_start + skv]
            kr = None if key_rope is None else key_rope[kv_start : kv_start + skv]
            kv_start += skv
        else:
            skv = actual_seq_lengths_kv[b]
            blocks = block_table[b, : math.ceil(skv / block_size)].long()

            def gather(c):
                if c.dim() == 4:  # (blocknum, N, blocksize, D)
                    return c[blocks].permute(0, 2, 1, 3).reshape(-1, c.shape[1], c.shape[3])[:skv]
                return c[blocks].reshape(-1, num_key_value_heads, c.shape[-1] // num_key_value_heads)[:skv]

            k, v = gather(key), gather(value)
            kr = None if key_rope is None else gather(key_rope)
        i, j, off = torch.arange(sq)[:, None], torch.arange(skv)[None, :], skv - sq
        vis = {
            0: torch.ones(sq, skv, dtype=torch.bool),
            3: j <= i + off,
            4: (j >= i + off - pre_tokens) & (j <= i + off + next_tokens),
        }[sparse_mode]
        for h in range(n):
            q = query[q_start:q_end, h].double()
            s = q @ k[:, h // group].double().T
            if query_rope is not None:
                s = s + query_rope[q_start:q_end, h].double() @ kr[:, h // group].double().T
            s = (s * scale).masked_fill(~vis, float("-inf"))
            m = torch.logsumexp(s, dim=-1)
            p = torch.where(vis, torch.exp(s - m[:, None].clamp_min(-1e300)), torch.zeros(()).double())
            out[q_start:q_end, h] = (p @ v[:, h // group].double()).to(out.dtype)
            lse[q_start:q_end, h, 0] = m
        q_start = q_end
    return out, (lse.float() if softmax_lse_flag else torch.zeros(1))


def npu_grouped_matmul(x, weights, *, group_list, group_list_type):
    """split_item 2: x's rows split by group_list (0 cumsum, 1 counts), y rows = x_g @ w_g ([K, N]), one tensor."""
    counts = group_list if group_list_type == 1 else torch.diff(group_list, prepend=group_list.new_zeros(1))
    ys, start = [], 0
    for g, c in enumerate(counts.tolist()):
        ys.append(x[start : start + c].double() @ weights[g].double())
        start += c
    y = torch.zeros(x.shape[0], weights[0].shape[1], dtype=torch.float64)
    y[:start] = torch.cat(ys)
    return y.to(x.dtype)


def npu_moe_init_routing_v2(x, expert_idx, *, expert_num):
    """Dropless: stable sort of the flattened expert ids; expanded_row_idx[sortedRowIdx[i]] = i;
    expanded_x[i] = x[sortedRowIdx[i] // k]; expert tokens as cumsum (expert_tokens_num_type 0)."""
    k = expert_idx.shape[1]
    sorted_row = torch.sort(expert_idx.reshape(-1).long(), stable=True).indices
    row_idx = torch.empty_like(sorted_row)
    row_idx[sorted_row] = torch.arange(sorted_row.numel())
    cumsum = torch.cumsum(torch.bincount(expert_idx.reshape(-1).long(), minlength=expert_num), 0)
    return x[sorted_row // k], row_idx.to(torch.int32), cumsum, None


def npu_moe_token_unpermute(permuted, sorted_indices, probs):
    """out[i] = sum_j permuted[S[i*k + j]] * probs[i][j]."""
    m, k = probs.shape
    return (
        (permuted[sorted_indices.long()].reshape(m, k, -1).double() * probs.double()[..., None])
        .sum(1)
        .to(permuted.dtype)
    )


def npu_moe_gating_top_k(
    x, *, k, bias, k_group, group_count, group_select_mode, renorm, norm_type, out_flag, routed_scaling_factor, eps
):
    """aclnnMoeGatingTopK: norm, + bias for selection, group filter (max or top-2 sum), top-k on the
    biased values, y gathered from the unbiased norm, y / (sum y + eps) * routedScalingFactor."""
    norm = torch.softmax(x.double(), -1) if norm_type == 0 else torch.sigmoid(x.double())
    value = norm + bias.double() if bias is not None else norm.clone()
    if group_count > 1:
        g = value.reshape(x.shape[0], group_count, -1)
        score = g.max(-1).values if group_select_mode == 0 else g.topk(2, -1).values.sum(-1)
        keep = torch.zeros_like(score, dtype=torch.bool).scatter_(1, score.topk(k_group, -1).indices, True)
        value = g.masked_fill(~keep[..., None], float("-inf")).reshape(x.shape[0], -1)
    ids = value.topk(k, -1).indices
    y = norm.gather(1, ids)
    return (y / (y.sum(-1, keepdim=True) + eps) * routed_scaling_factor).float(), ids.int(), None


def npu_rotary_mul(x, r1, r2):
    """Half (neox) mode: x * r1 + cat(-x2, x1) * r2."""
    x1, x2 = x.chunk(2, -1)
    return x * r1 + torch.cat([-x2, x1], -1) * r2


# ----------------------------------------------------------------------------- attention


def _paged_case(seed, hq=4, hkv=2, d=16, bs=4, query_lens=(5, 1, 3, 1), seq_lens=(9, 6, 3, 12)):
    g = torch.Generator().manual_seed(seed)
    blocks = [math.ceil(s / bs) for s in seq_lens]
    nb = sum(blocks) + 3
    order = torch.randperm(nb, generator=g).tolist()
    table, at = [], 0
    for n in blocks:
        table.append(order[at : at + n] + [0] * (max(blocks) - n))
        at += n
    meta = AttentionMeta.build(query_lens, seq_lens, table)
    q = torch.randn(sum(query_lens), hq, d, generator=g)
    kc, vc = torch.randn(nb, bs, hkv, d, generator=g), torch.randn(nb, bs, hkv, d, generator=g)
    return q, kc, vc, meta


@pytest.mark.parametrize(
    "causal,window", [(True, (-1, -1)), (False, (-1, -1)), (True, (2, -1)), (False, (3, 1)), (False, (-1, 0))]
)
@pytest.mark.parametrize("layout", ["bsh", "bnsd"])
def test_paged_attention_conversion(causal, window, layout):
    q, kc, vc, meta = _paged_case(0)
    q_lens, kv_lens = cv.paged_lengths(meta)
    assert q_lens == [5, 6, 9, 10] and kv_lens == [9, 6, 3, 12]
    sp = cv.sparse_args(causal, window)
    to_npu = cv.paged_kv_bsh if layout == "bsh" else cv.paged_kv_bnsd
    out, lse = npu_fia(
        cv.tnd_query(q),
        to_npu(kc),
        to_npu(vc),
        actual_seq_lengths=q_lens,
        actual_seq_lengths_kv=kv_lens,
        num_heads=4,
        num_key_value_heads=2,
        scale=0.3,
        sparse_mode=sp["sparse_mode"],
        pre_tokens=sp["pre_tokens"],
        next_tokens=sp["next_tokens"],
        input_layout="TND",
        atten_mask=cv.causal_mask() if sp["mask"] else None,
        block_table=meta.block_table,
        block_size=kc.shape[1],
        softmax_lse_flag=True,
    )
    want, want_lse = ref_attn.paged_attention(q, kc, vc, meta, scale=0.3, causal=causal, window=window, return_lse=True)
    torch.testing.assert_close(out, want, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(cv.lse_from_npu(lse), want_lse, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("causal", [True, False])
def test_varlen_attention_conversion(causal):
    g = torch.Generator().manual_seed(1)
    ql, kl = [3, 1, 4], [5, 1, 4]
    cq, ck = torch.tensor([0, 3, 4, 8], dtype=torch.int32), torch.tensor([0, 5, 6, 10], dtype=torch.int32)
    q, k, v = (
        torch.randn(8, 4, 16, generator=g),
        torch.randn(10, 1, 16, generator=g),
        torch.randn(10, 1, 8, generator=g),
    )
    q_lens, kv_lens = cv.varlen_lengths(cq, ck)
    sp = cv.sparse_args(causal, (-1, -1))
    out, lse = npu_fia(
        q,
        k,
        v,
        actual_seq_lengths=q_lens,
        actual_seq_lengths_kv=kv_lens,
        num_heads=4,
        num_key_value_heads=1,
        scale=0.25,
        input_layout="TND",
        atten_mask=cv.causal_mask() if sp["mask"] else None,
        softmax_lse_flag=True,
        sparse_mode=sp["sparse_mode"],
        pre_tokens=sp["pre_tokens"],
        next_tokens=sp["next_tokens"],
    )
    want, want_lse = ref_attn.varlen_attention(
        q, k, v, cq, ck, max(ql), max(kl), scale=0.25, causal=causal, return_lse=True
    )
    torch.testing.assert_close(out, want, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(cv.lse_from_npu(lse), want_lse, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("query_lens", [(1, 1, 1), (4, 1, 2)])
def test_mla_attention_conversion(query_lens):
    g = torch.Generator().manual_seed(2)
    meta = AttentionMeta.build(query_lens, [7, 3, 5], [[0, 1], [2, 0], [3, 4]])
    t, h, lkv, r = sum(query_lens), 32, 32, 8  # FIA's real shapes are L = 512, R = 64; the conversion is shape-agnostic
    q_nope, q_pe = torch.randn(t, h, lkv, generator=g), torch.randn(t, h, r, generator=g)
    ckv, kpe = torch.randn(5, 4, lkv, generator=g), torch.randn(5, 4, r, generator=g)
    q_lens, kv_lens = cv.paged_lengths(meta)
    sp = cv.sparse_args(meta.max_query_len > 1, (-1, -1))  # doc: Q_S = 1 takes only sparse 0 without a mask
    key = cv.paged_kv_bsh(ckv)
    out, _ = npu_fia(
        q_nope,
        key,
        key,
        query_rope=q_pe,
        key_rope=cv.paged_kv_bsh(kpe),
        actual_seq_lengths=q_lens,
        actual_seq_lengths_kv=kv_lens,
        num_heads=h,
        num_key_value_heads=1,
        scale=0.1,
        input_layout="TND",
        sparse_mode=sp["sparse_mode"],
        pre_tokens=sp["pre_tokens"],
        next_tokens=sp["next_tokens"],
        atten_mask=cv.causal_mask() if sp["mask"] else None,
        block_table=meta.block_table,
        block_size=4,
    )
    want = ref_attn.mla_attention(q_nope, q_pe, ckv, kpe, meta, scale=0.1, causal=True)
    torch.testing.assert_close(out, want, atol=ATOL, rtol=RTOL)


def test_sparse_args_and_lse():
    assert cv.sparse_args(True, (-1, -1)) == {
        "sparse_mode": 3,
        "pre_tokens": cv.INT_MAX,
        "next_tokens": 0,
        "mask": True,
    }
    assert cv.sparse_args(False, (-1, -1))["sparse_mode"] == 0 and not cv.sparse_args(False, (-1, -1))["mask"]
    assert cv.sparse_args(True, (127, 5)) == {"sparse_mode": 4, "pre_tokens": 127, "next_tokens": 0, "mask": True}
    assert cv.sparse_args(False, (-1, 3))["pre_tokens"] == cv.INT_MAX
    assert cv.causal_mask() is cv.causal_mask() and cv.causal_mask().shape == (2048, 2048)
    lse = cv.lse_from_npu(torch.tensor([[[1.0], [float("inf")]], [[float("nan")], [-2.0]]]))
    assert lse.tolist() == [[1.0, float("-inf")], [float("-inf"), -2.0]]


# ----------------------------------------------------------------------------- gemm, moe, layers


@pytest.mark.parametrize("group_list_type", [0, 1])
def test_grouped_gemm_conversion(group_list_type):
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(11, 8, generator=g), torch.randn(4, 6, 8, generator=g)
    ends = torch.tensor([3, 3, 7, 9], dtype=torch.int32)  # an empty group and two rows past the last one
    gl = cv.group_list(ends, group_list_type)
    assert gl.dtype == torch.int64 and gl.tolist() == ([3, 3, 7, 9] if group_list_type == 0 else [3, 0, 4, 2])
    w = cv.grouped_weights(b)
    out = npu_grouped_matmul(a, [w[i] for i in range(4)], group_list=gl, group_list_type=group_list_type)
    torch.testing.assert_close(out, ref_gemm.grouped_gemm(a, b, ends), atol=ATOL, rtol=RTOL)


def test_moe_permute_and_unpermute_conversion():
    g = torch.Generator().manual_seed(4)
    x, ids = torch.randn(5, 8, generator=g), torch.randint(0, 6, (5, 3), generator=g, dtype=torch.int32)
    x_sorted, row_idx, cumsum, _ = npu_moe_init_routing_v2(x, ids, expert_num=6)
    perm = cv.perm_from_row_idx(row_idx)
    want_x, want_ends, want_perm = ref_moe.moe_permute(x, ids, 6)
    assert torch.equal(perm, want_perm) and torch.equal(cumsum.to(torch.int32), want_ends)
    torch.testing.assert_close(x_sorted, want_x)
    y_sorted, weights = torch.randn(15, 8, generator=g), torch.rand(5, 3, generator=g)
    out = npu_moe_token_unpermute(y_sorted, cv.unpermute_indices(want_perm), weights)
    torch.testing.assert_close(out, ref_moe.moe_unpermute(y_sorted, want_perm, weights), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize(
    "scoring,n_group,topk_group,bias,factor",
    [("sigmoid", 4, 2, True, 2.5), ("softmax", 1, 1, False, 1.0), ("softmax", 4, 2, False, 1.0)],
)
def test_route_conversion(scoring, n_group, topk_group, bias, factor):
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(7, 16, generator=g)
    cb = torch.randn(16, generator=g) * 0.1 if bias else None
    args = cv.gating_args(3, scoring, n_group, topk_group, bias, factor)
    w, ids, _ = npu_moe_gating_top_k(logits, bias=cb, **args)
    want_w, want_ids = ref_moe.route(
        logits,
        top_k=3,
        scoring=scoring,
        n_group=n_group,
        topk_group=topk_group,
        correction_bias=cb,
        routed_scaling_factor=factor,
    )
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(w, want_w, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("rot", [16, 8])
def test_rotary_conversion(rot):
    g = torch.Generator().manual_seed(6)
    pos, cache = torch.tensor([0, 5, 2, 9]), torch.randn(10, rot, generator=g)
    q, k = torch.randn(4, 4, 16, generator=g), torch.randn(4, 2, 16, generator=g)
    r1, r2 = cv.rotary_factors(pos, cache)
    got = [torch.cat([npu_rotary_mul(x[..., :rot].unsqueeze(1), r1, r2).squeeze(1), x[..., rot:]], -1) for x in (q, k)]
    want = ref_layers.rotary_embedding(pos, q, k, cache, is_neox=True)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL)


# ----------------------------------------------------------------------------- backend surface


def test_supports_states_documented_limits():
    be = AscendBackend("meta")
    assert "multiples of 128" in be.supports("paged_attention", dtype=torch.bfloat16, head_dim=128, block_size=16)
    assert be.supports("paged_attention", dtype=torch.bfloat16, head_dim=128, block_size=128) is None
    assert "float16 or bfloat16" in be.supports("varlen_attention", dtype=torch.float32)
    assert "sparse_mode" in be.supports("paged_attention", window=(127, -1))
    assert "softcap" in be.supports("paged_attention", softcap=30.0)
    assert "16 or 128" in be.supports("mla_attention", block_size=64)
    assert "unverified" in be.supports("rotary_embedding", is_neox=False)
    assert "unverified" in be.supports("route", scoring="softmax", top_k=8)
    if triton_ascend_version() is None:
        assert be.supports("gemm", dtype=torch.bfloat16) == "no torch_npu fused op and triton-ascend is not installed"
    for op in AscendBackend.UNVERIFIED_OPS:
        assert "never run on an NPU" in getattr(AscendBackend, op).__doc__


@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None, reason="torch_npu is installed here")
def test_cli_lists_ascend_unavailable():
    hetero = Path(sys.executable).with_name("hetero")
    res = subprocess.run([str(hetero), "backends", "--json"], capture_output=True, text=True, check=True, cwd=ROOT)
    row = next(b for b in json.loads(res.stdout)["backends"] if b["name"] == "ascend")
    assert row["status"] == "unavailable" and row["reason"] == "torch_npu is not installed"
    assert row["package"] == "hetero-ascend" and row["priority"] == 100


def test_explain_marks_every_op_as_never_run_on_an_npu():
    import hetero

    ops, avail = hetero.Registry().inspect("ascend")
    assert not avail.ok
    info = ops.explain()
    assert all(any("never run on an NPU" in r for r in i.reasons) for i in info.values()), info
    assert "torch_npu.npu_grouped_matmul" in info["grouped_gemm"].reasons[0]
    assert "triton-ascend" in info["write_kv"].reasons[0]
