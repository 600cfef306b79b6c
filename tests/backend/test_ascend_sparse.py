"""hetero-ascend's DSA mappings without an NPU: indexer_topk -> npu_lightning_indexer, sparse mla_attention ->
npu_sparse_flash_attention, and layer_norm, checked on CPU.

The fake torch_npu below is written from the torch_npu / CANN documentation's stated semantics (cited in
hetero_ascend.sparse), not from hetero's spec: it asserts the documented argument forms (int32 lengths,
cumulative TND query ends, PA_BSND keys, the valid-first index rule) and raises on any read outside a
tensor. The backend's methods run against it and are compared with hetero_cpu_ref. What these tests cannot
show is that the real operators behave as documented: none has run on an NPU.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("hetero_ascend.plugin", reason="hetero-ascend is not installed (pip install -e backends/ascend)")
import hetero_cpu_ref.attention as ref_attn  # noqa: E402
import hetero_cpu_ref.dsa as ref_dsa  # noqa: E402
import hetero_cpu_ref.layers as ref_layers  # noqa: E402
from hetero.spec import AttentionMeta  # noqa: E402
from hetero_ascend import common, plugin, sparse  # noqa: E402
from hetero_ascend.plugin import AscendBackend  # noqa: E402

INT32 = torch.int32


def _batch_keys(key: torch.Tensor, block_table: torch.Tensor, b: int, length: int) -> torch.Tensor:
    """PA_BSND [NB, BS, 1, D] -> the first ``length`` keys of batch b [length, D]; a block id outside the
    cache raises (on an NPU: an AI Core exception)."""
    bs = key.shape[1]
    ids = block_table[b, : math.ceil(length / bs)].long()
    assert bool(((ids >= 0) & (ids < key.shape[0])).all()), "block id outside the cache"
    return key[ids].reshape(-1, key.shape[-1])[:length]


def _check_lengths(q_ends, kv_lens, block_table, key, t):
    assert q_ends.dtype == INT32 and kv_lens.dtype == INT32 and block_table.dtype == INT32
    assert q_ends.numel() == kv_lens.numel() == block_table.shape[0]
    assert bool((q_ends.diff() >= 0).all()) and int(q_ends.min()) >= 0 and int(q_ends.max()) <= t
    assert bool((kv_lens >= 0).all()) and int(kv_lens.max()) <= block_table.shape[1] * key.shape[1]


def npu_lightning_indexer(
    query,
    key,
    weights,
    *,
    actual_seq_lengths_query,
    actual_seq_lengths_key,
    block_table,
    layout_query,
    layout_key,
    sparse_count,
    sparse_mode,
):
    """As the op-plugin test's reference: per batch, sum_h w * relu(q.k) over its keys, rightDownCausal
    masked (-inf) when sparse_mode 3, sorted descending; min(sparse_count, KV length) entries written (masked
    ones included), the rest -1. Returns (indices [T, 1, K] int32, values)."""
    assert layout_query == "TND" and layout_key == "PA_BSND" and sparse_mode in (0, 3)
    assert query.is_contiguous() and key.is_contiguous() and key.dim() == 4 and key.shape[2] == 1
    assert weights.dtype == torch.float32 and weights.shape == query.shape[:2] and 1 <= sparse_count <= 2048
    _check_lengths(actual_seq_lengths_query, actual_seq_lengths_key, block_table, key, query.shape[0])
    out = torch.full((query.shape[0], 1, sparse_count), -1, dtype=INT32)
    start = 0
    for b, end in enumerate(actual_seq_lengths_query.tolist()):
        s2 = int(actual_seq_lengths_key[b])
        k = _batch_keys(key, block_table, b, s2).double()
        q, w = query[start:end].double(), weights[start:end].double()
        score = (torch.einsum("nhd,ld->nhl", q, k).clamp_min(0) * w[..., None]).sum(1)
        if sparse_mode == 3:
            for i in range(end - start):  # row -1-i sees keys < s2 - i
                score[end - start - 1 - i, s2 - i :] = float("-inf")
        order = torch.sort(score, dim=1, descending=True, stable=True).indices[:, :sparse_count]
        out[start:end, 0, : order.shape[1]] = order.to(INT32)
        start = end
    return out, torch.zeros(0)


def npu_sparse_flash_attention(
    query,
    key,
    value,
    sparse_indices,
    scale_value,
    *,
    block_table,
    actual_seq_lengths_query,
    actual_seq_lengths_kv,
    query_rope,
    key_rope,
    sparse_block_size,
    layout_query,
    layout_kv,
    sparse_mode,
    attention_mode,
    return_softmax_lse,
):
    """MLA-absorb (attention_mode 2): logits over cat(nope, rope), values = the nope key; per row the valid
    (leading) indices, each a position of the batch read through its block table; rightDownCausal when
    sparse_mode 3. A row with no valid index gets NaN (undocumented: the caller must not rely on it)."""
    assert layout_query == "TND" and layout_kv == "PA_BSND" and attention_mode == 2 and sparse_block_size == 1
    assert not return_softmax_lse and key is value and sparse_mode in (0, 3) and isinstance(scale_value, float)
    assert sparse_indices.dtype == INT32 and sparse_indices.is_contiguous() and sparse_indices.shape[1] == 1
    for x in (query, key, query_rope, key_rope):
        assert x.is_contiguous()
    _check_lengths(actual_seq_lengths_query, actual_seq_lengths_kv, block_table, key, query.shape[0])
    out = torch.full(query.shape, float("nan"), dtype=query.dtype)
    start = 0
    for b, end in enumerate(actual_seq_lengths_query.tolist()):
        s2 = int(actual_seq_lengths_kv[b])
        kn, kr = _batch_keys(key, block_table, b, s2).double(), _batch_keys(key_rope, block_table, b, s2).double()
        for r in range(start, end):
            row = sparse_indices[r, 0].long()
            n = int((row >= 0).sum())
            assert bool((row[:n] >= 0).all()) and bool((row[n:] == -1).all()), "valid entries must come first"
            ids = row[:n]
            assert bool((ids < s2).all()), "index past the batch's KV length"
            if sparse_mode == 3:
                ids = ids[ids <= s2 - (end - r)]
            if not ids.numel():
                continue
            logits = (query[r].double() @ kn[ids].T + query_rope[r].double() @ kr[ids].T) * scale_value
            out[r] = (torch.softmax(logits, -1) @ kn[ids]).to(out.dtype)
        start = end
    return out, None, None


FAKE = SimpleNamespace(
    npu_lightning_indexer=npu_lightning_indexer, npu_sparse_flash_attention=npu_sparse_flash_attention
)


@pytest.fixture
def npu(monkeypatch):
    monkeypatch.setattr(common, "torch_npu", lambda: FAKE)
    return AscendBackend("cpu")


def _meta(query_lens, seq_lens, bs, gen, spare=2):
    need = [math.ceil(s / bs) for s in seq_lens]
    order = torch.randperm(sum(need) + spare, generator=gen).tolist()
    table, at = [], 0
    for n in need:
        table.append(order[at : at + n] + [0] * (max(need) - n))
        at += n
    return AttentionMeta.build(query_lens, seq_lens, table), sum(need) + spare


# ----------------------------------------------------------------------------- conversions


def test_lengths_positions_and_clamps():
    meta = AttentionMeta.build([3, 0, 2], [7, 4, 2], [[4, 1], [0, 0], [9, 2]])
    got = sparse.dsa_lengths(meta, num_tokens=5, num_blocks=5, block_size=4)
    assert got.q_ends.dtype == INT32 and got.q_ends.tolist() == [3, 3, 5]  # TND: cumulative ends
    assert got.kv_lens.dtype == INT32 and got.kv_lens.tolist() == [7, 4, 2]  # PA_BSND: per-sequence lengths
    assert got.pos.tolist() == [4, 5, 6, 0, 1] and got.length.tolist() == [7, 7, 7, 2, 2]
    assert got.block_table.dtype == INT32 and got.block_table.tolist() == [[4, 1], [0, 0], [0, 2]]  # id 9 >= NB
    bad = AttentionMeta.build([4, 1], [30, 3], [[0, 1], [2, 3]])  # 30 keys in a 2-block (8-key) row; T = 5 given as 3
    got = sparse.dsa_lengths(bad, num_tokens=3, num_blocks=4, block_size=4)
    assert got.q_ends.tolist() == [3, 3] and got.kv_lens.tolist() == [8, 3] and got.pos.tolist() == [5, 6, 7]


def test_indices_from_npu_drops_masked_positions():
    meta = AttentionMeta.build([2], [3], [[0]])
    lengths = sparse.dsa_lengths(meta, num_tokens=2, num_blocks=1, block_size=4)
    raw = torch.tensor([[[1, 2, 0, -1]], [[2, 0, 1, -1]]], dtype=INT32)  # row 0 (pos 1) lists the masked key 2
    assert sparse.indices_from_npu(raw, lengths).tolist() == [[1, -1, 0, -1], [2, 0, 1, -1]]


@pytest.mark.parametrize("causal", [True, False])
def test_sfa_indices_pack_valid_entries_first(causal):
    meta = AttentionMeta.build([2, 1], [5, 3], [[0, 1], [2, 0]])
    lengths = sparse.dsa_lengths(meta, num_tokens=3, num_blocks=3, block_size=4)
    topk = torch.tensor([[-1, 4, 3, 9], [4, -1, 7, 0], [-5, 2, 3, 1]], dtype=torch.int64)
    idx, kept = sparse.sfa_indices(topk, lengths, causal)
    assert idx.dtype == INT32 and idx.shape == (3, 1, 4)
    want = (
        [[3, -1, -1, -1], [4, 0, -1, -1], [2, 1, -1, -1]]
        if causal
        else [[4, 3, -1, -1], [4, 0, -1, -1], [2, 1, -1, -1]]
    )
    assert idx[:, 0].tolist() == want and kept.tolist() == [True, True, True]
    none = torch.full((3, 2), -1)
    assert not sparse.sfa_indices(none, lengths, causal)[1].any()


# ----------------------------------------------------------------------------- the methods against the fake


def _indexer_case(seed, query_lens, seq_lens, hi=64, d=16, bs=16):
    g = torch.Generator().manual_seed(seed)
    meta, nb = _meta(query_lens, seq_lens, bs, g)
    t = sum(query_lens)
    q = torch.randn(t, hi, d, generator=g).to(torch.bfloat16)
    weights = torch.randn(t, hi, generator=g) * hi**-0.5
    cache = torch.randn(nb, bs, d, generator=g).to(torch.bfloat16)
    return q, weights, cache, meta


@pytest.mark.parametrize(
    "query_lens,seq_lens,topk", [((1, 1, 1), (40, 7, 33), 8), ((9, 1, 4), (9, 50, 20), 6), ((5,), (5,), 16)]
)
def test_indexer_topk_against_the_reference(npu, monkeypatch, query_lens, seq_lens, topk):
    monkeypatch.setattr(sparse, "indexer_static", lambda *a: {})  # the doc's D 128; the conversion is shape-agnostic
    q, w, cache, meta = _indexer_case(0, query_lens, seq_lens)
    got = npu.indexer_topk(q, w, cache, meta, topk=topk)
    want = ref_dsa.indexer_topk(q, w, cache, meta, topk=topk)
    assert got.dtype == INT32 and got.shape == want.shape
    assert [sorted(r) for r in got.tolist()] == [sorted(r) for r in want.tolist()]  # compared as a set


def test_indexer_topk_outside_the_documented_limits_takes_the_triton_kernel(npu, monkeypatch):
    q, w, cache, meta = _indexer_case(1, (2,), (9,), hi=32)  # GLM-5's 32 heads: not the documented TND 64
    calls = []
    monkeypatch.setattr(
        plugin.TritonBackend, "indexer_topk", lambda self, *a, **k: calls.append(k) or "triton", raising=False
    )
    assert npu.indexer_topk(q, w, cache, meta, topk=4) == "triton" and calls[0]["topk"] == 4


def test_empty_steps_make_no_npu_call(npu, monkeypatch):
    monkeypatch.setattr(sparse, "indexer_static", lambda *a: {})
    monkeypatch.setattr(sparse, "sfa_static", lambda *a: {})
    monkeypatch.setattr(common, "torch_npu", lambda: None)  # the ops reject empty tensors (doc): never called
    meta = AttentionMeta.build([], [], [])
    q, w, cache = (
        torch.zeros(0, 64, 16, dtype=torch.bfloat16),
        torch.zeros(0, 64),
        torch.zeros(2, 16, 16, dtype=torch.bfloat16),
    )
    got = npu.indexer_topk(q, w, cache, meta, topk=3)
    assert got.shape == (0, 3) and got.dtype == INT32
    qn, qp, ckv, kpe = torch.zeros(0, 4, 32), torch.zeros(0, 4, 8), torch.zeros(2, 16, 32), torch.zeros(2, 16, 8)
    out = npu.mla_attention(qn, qp, ckv, kpe, meta, scale=0.1, topk_indices=torch.zeros(0, 5, dtype=INT32))
    assert out.shape == (0, 4, 32)


def _sparse_case(seed, query_lens, seq_lens, topk, h=4, lkv=32, r=8, bs=16):
    g = torch.Generator().manual_seed(seed)
    meta, nb = _meta(query_lens, seq_lens, bs, g)
    t = sum(query_lens)
    q_nope, q_pe = (
        torch.randn(t, h, lkv, generator=g).to(torch.bfloat16),
        torch.randn(t, h, r, generator=g).to(torch.bfloat16),
    )
    ckv, kpe = (
        torch.randn(nb, bs, lkv, generator=g).to(torch.bfloat16),
        torch.randn(nb, bs, r, generator=g).to(torch.bfloat16),
    )
    rows = [torch.randperm(max(seq_lens) + 6, generator=g)[:topk] - 3 for _ in range(t)]  # -3..: padding and past pos
    return q_nope, q_pe, ckv, kpe, meta, torch.stack(rows).to(INT32)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("query_lens,seq_lens", [((1, 1, 1), (30, 5, 17)), ((6, 1), (6, 40))])
def test_sparse_mla_attention_against_the_reference(npu, monkeypatch, causal, query_lens, seq_lens):
    monkeypatch.setattr(sparse, "sfa_static", lambda *a: {})  # the doc's 512/64 dims; the conversion is shape-agnostic
    q_nope, q_pe, ckv, kpe, meta, idx = _sparse_case(3, query_lens, seq_lens, topk=8)
    idx[0] = -1  # a row that keeps nothing: out 0
    got = npu.mla_attention(q_nope, q_pe, ckv, kpe, meta, scale=0.2, causal=causal, topk_indices=idx)
    want = ref_attn.mla_attention(q_nope, q_pe, ckv, kpe, meta, scale=0.2, causal=causal, topk_indices=idx)
    assert not got.isnan().any() and got[0].abs().max() == 0
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


def test_sparse_mla_outside_the_documented_limits_takes_the_triton_kernel(npu, monkeypatch):
    q_nope, q_pe, ckv, kpe, meta, idx = _sparse_case(4, (1,), (9,), topk=4)  # Lkv 32: not the documented 512
    monkeypatch.setattr(plugin.TritonBackend, "mla_attention", lambda self, *a, **k: ("triton", k), raising=False)
    tag, kw = npu.mla_attention(q_nope, q_pe, ckv, kpe, meta, scale=0.2, topk_indices=idx)
    assert tag == "triton" and kw["topk_indices"] is idx


@pytest.mark.parametrize("sparse_call", [True, False])
def test_mla_sinks_take_the_triton_kernel(npu, monkeypatch, sparse_call):
    """Neither FIA nor SFA has sinks (spec 1.7): a call with them goes to the Triton kernel whole."""
    q_nope, q_pe, ckv, kpe, meta, idx = _sparse_case(4, (1,), (9,), topk=4)
    monkeypatch.setattr(plugin.TritonBackend, "mla_attention", lambda self, *a, **k: ("triton", k), raising=False)
    sinks = torch.zeros(q_nope.shape[1])
    tag, kw = npu.mla_attention(
        q_nope, q_pe, ckv, kpe, meta, scale=0.2, topk_indices=idx if sparse_call else None, sinks=sinks
    )
    assert tag == "triton" and kw["sinks"] is sinks and (kw["topk_indices"] is idx) == sparse_call


def test_layer_norm_against_the_reference():
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(7, 3, 128, generator=g) * 3 + 1).to(torch.bfloat16)
    w, b = torch.randn(128, generator=g), torch.randn(128, generator=g).to(torch.bfloat16)
    be = AscendBackend("cpu")
    for bias in (b, None):
        got = be.layer_norm(x, w, bias, 1e-6)
        assert got.dtype == x.dtype
        torch.testing.assert_close(got, ref_layers.layer_norm(x, w, bias, 1e-6), atol=0, rtol=0)


# ----------------------------------------------------------------------------- declines


def test_supports_states_the_documented_dsa_limits():
    be = AscendBackend("meta")
    li = {"dtype": torch.bfloat16, "num_heads": 64, "head_dim": 128, "block_size": 64, "topk": 2048}
    assert be.supports("indexer_topk", **li) is None
    assert "64 query heads" in be.supports("indexer_topk", **{**li, "num_heads": 32})
    assert "1..2048" in be.supports("indexer_topk", **{**li, "topk": 4096})
    assert "head_dim 128" in be.supports("indexer_topk", **{**li, "head_dim": 64})
    assert "multiple of 16" in be.supports("indexer_topk", **{**li, "block_size": 8})
    assert "fp8 index cache" in be.supports("indexer_topk", **li, index_scale=True)
    assert "float16 or bfloat16" in be.supports("indexer_topk", **{**li, "dtype": torch.float32})
    sfa = {
        "dtype": "bfloat16",
        "topk_indices": True,
        "num_heads": 128,
        "block_size": 64,
        "head_dim": 576,
        "head_dim_v": 512,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
    }
    assert be.supports("mla_attention", **sfa) is None
    assert "no lse" in be.supports("mla_attention", **sfa, return_lse=True)
    assert "query heads" in be.supports("mla_attention", **{**sfa, "num_heads": 24})
    assert "kv_lora_rank 512" in be.supports("mla_attention", **{**sfa, "kv_lora_rank": 256, "head_dim_v": None})
    assert "16 or 128" in be.supports("mla_attention", **{**sfa, "topk_indices": None})  # dense: FIA's blocks
    for topk in (True, None):  # spec 1.7's sinks: neither SFA nor FIA's MLA form has them
        assert "no attention sinks" in be.supports("mla_attention", **{**sfa, "topk_indices": topk, "sinks": True})
    assert (
        "float64" in be.supports("layer_norm", dtype=torch.float64)
        and be.supports("layer_norm", dtype="bfloat16") is None
    )
    notes = AscendBackend.op_notes()
    for op in ("indexer_topk", "mla_attention", "layer_norm"):
        assert "never run on an NPU" in notes[op] and "never run on an NPU" in getattr(AscendBackend, op).__doc__
    assert "tie" in notes["indexer_topk"] and "npu_sparse_flash_attention" in notes["mla_attention"]


def test_kv_compress_is_declined_with_its_reason():
    """No torch_npu operator compresses DeepSeek-V4's KV (spec 1.8): the reference runs kv_compress."""
    reason = AscendBackend("meta").supports("kv_compress", dtype=torch.bfloat16, head_dim=512, ratio=4, overlap=True)
    assert "no KV-compressor operator" in reason and "never run on an NPU" in reason
