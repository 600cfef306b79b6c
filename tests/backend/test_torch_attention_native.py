"""hetero-torch's native CPU paged attention and KV write (``_attention_native``): against the float64
reference on real layouts and edges, unchecked metadata that must not read outside the cache, and
the ops inside a compiled graph."""

from __future__ import annotations

import pytest
import torch

import hetero
from hetero.spec.types import AttentionMeta
from hetero.verify.metrics import compare
from hetero.verify.tolerances import tolerance

pytest.importorskip("hetero_torch")
from hetero_torch import _attention_native as native  # noqa: E402

REF = hetero.load("cpu_ref")


def _require_native():
    if not native.applies(torch.empty(1, 1, 1, 1), torch.empty(1, 1, 1, 1)):
        pytest.skip("the native CPU kernels are not available here")


def _layout(gen, query_lens, seq_lens, heads, kv_heads, d, dv, bs):
    """A shuffled paged cache holding the sequences, NaN in every slot no sequence owns."""
    cols = max(-(-s // bs) for s in seq_lens) + 1
    blocks = len(seq_lens) * cols + 2
    k_cache = torch.full((blocks, bs, kv_heads, d), float("nan"))
    v_cache = torch.full((blocks, bs, kv_heads, dv), float("nan"))
    table = torch.randperm(blocks, generator=gen)[: len(seq_lens) * cols].view(len(seq_lens), cols).int()
    for b, length in enumerate(seq_lens):
        for j in range(length):
            k_cache[table[b, j // bs], j % bs] = torch.randn(kv_heads, d, generator=gen)
            v_cache[table[b, j // bs], j % bs] = torch.randn(kv_heads, dv, generator=gen)
    meta = AttentionMeta.build(query_lens, seq_lens, table)
    return torch.randn(sum(query_lens), heads, d, generator=gen), k_cache, v_cache, meta


CASES = {
    "decode": dict(query_lens=[1] * 6, seq_lens=[1, 7, 64, 65, 130, 200]),
    "mixed": dict(query_lens=[37, 1, 1, 100], seq_lens=[37, 90, 1, 160]),
    "chunked prefill": dict(query_lens=[20, 70], seq_lens=[150, 70]),
    "window": dict(query_lens=[30, 1, 1], seq_lens=[130, 100, 5], window=(15, -1)),
    "softcap and lse": dict(query_lens=[9, 1], seq_lens=[80, 129], softcap=7.5, return_lse=True),
    "sinks": dict(query_lens=[1, 12], seq_lens=[70, 12], sinks=True, window=(4, -1), return_lse=True),
    "bidirectional window": dict(query_lens=[40], seq_lens=[40], causal=False, window=(6, 3), return_lse=True),
    "MQA, odd head dim, block size 1": dict(
        query_lens=[3, 1], seq_lens=[3, 90], heads=6, kv_heads=1, d=40, dv=24, bs=1
    ),
    # from row 2 on, bf16 SDPA: P rounded to bf16 before P @ V, held to the spec's bf16 tolerance
    "decodes, then fresh prompts past SDPA_MIN_ROWS": dict(
        query_lens=[1, 1, 90, 64, 3], seq_lens=[40, 7, 90, 64, 3], bf16_sdpa_from=2
    ),
    "decodes, then chunks past SDPA_MIN_ROWS": dict(
        query_lens=[1, 1, 1, 100, 70, 3], seq_lens=[50, 90, 3, 130, 70, 40]
    ),
    "8 heads a KV head, d 128": dict(query_lens=[5, 1], seq_lens=[70, 33], heads=16, kv_heads=2, d=128, dv=128, bs=16),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", CASES)
def test_native_paged_attention_matches_float64(name, dtype):
    """float32: within float32 accumulation; bfloat16: the float64 result on the same bf16 inputs,
    rounded once (within half an ulp, plus float32 accumulation), lse in float32."""
    _require_native()
    spec = dict(CASES[name])
    shape = {k: spec.pop(k, v) for k, v in dict(heads=4, kv_heads=2, d=32, dv=32, bs=32).items()}
    query_lens, seq_lens, sdpa_from = spec.pop("query_lens"), spec.pop("seq_lens"), spec.pop("bf16_sdpa_from", None)
    gen = torch.Generator().manual_seed(len(name))
    q, k_cache, v_cache, meta = _layout(gen, query_lens, seq_lens, **shape)
    q, k_cache, v_cache = q.to(dtype), k_cache.to(dtype), v_cache.to(dtype)
    if spec.pop("sinks", False):
        spec["sinks"] = torch.randn(shape["heads"], generator=gen)
    d = shape["d"]
    assert native.applies(k_cache, v_cache, q, sinks=spec.get("sinks"))
    out = torch.full((q.shape[0], shape["heads"], shape["dv"]), float("nan"), dtype=dtype)  # every row written
    got = hetero.load("torch").paged_attention(q, k_cache, v_cache, meta, scale=d**-0.5, out=out, **spec)
    want = REF.paged_attention(q.double(), k_cache.double(), v_cache.double(), meta, scale=d**-0.5, **spec)
    got, want = (got, want) if spec.get("return_lse") else ((got,), (want,))
    assert got[0] is out
    if dtype == torch.float32:
        tol = [dict(atol=3e-5, rtol=3e-5)] * 2
    else:  # truncating instead of rounding would miss by up to a whole ulp
        tol = [dict(atol=1e-5, rtol=2**-8), dict(atol=1e-4, rtol=1e-5)]
    if dtype == torch.bfloat16 and sdpa_from is not None:
        allowed, m = tolerance("bfloat16"), compare(got[0][sdpa_from:], want[0][sdpa_from:])
        assert m.max_abs <= allowed.floor * m.scale and m.rel_l2 <= allowed.max_rel_l2, m
        got, want = (got[0][:sdpa_from],), (want[0][:sdpa_from],)
    for g, w, t in zip(got, want, tol):
        torch.testing.assert_close(g.double(), w.double(), **t)


def test_decodes_stay_native_and_long_chunks_go_to_sdpa(monkeypatch):
    """A batch with a chunk of SDPA_MIN_ROWS rows or more: its leading decodes in one native call,
    the sequences from the first multi-row one on through torch's SDPA, planned or not."""
    _require_native()
    from hetero_torch import attention

    ops, gen = hetero.load("torch"), torch.Generator().manual_seed(7)
    q, k_cache, v_cache, meta = _layout(gen, [1, 1, 80, 5], [40, 9, 80, 60], 4, 2, 32, 32, 16)
    calls = []  # rows of each call: native negative, grouped positive
    grouped, native_call = attention._grouped, attention.native.paged_attention
    monkeypatch.setattr(attention, "_grouped", lambda q, *a, **k: calls.append(q.shape[0]) or grouped(q, *a, **k))
    monkeypatch.setattr(
        attention.native, "paged_attention", lambda q, *a, **k: calls.append(-q.shape[0]) or native_call(q, *a, **k)
    )
    want = REF.paged_attention(q.double(), k_cache.double(), v_cache.double(), meta, scale=0.2)
    planned = ops.plan_attention(meta, num_tokens=87, num_blocks=k_cache.shape[0], block_size=16)
    for m in (meta, planned):
        calls.clear()
        got = ops.paged_attention(q, k_cache, v_cache, m, scale=0.2)
        torch.testing.assert_close(got.double(), want, atol=3e-5, rtol=3e-5)
        assert calls == [-2, 85]  # 2 decode rows native, 85 rows grouped


def test_native_paged_attention_of_no_tokens_and_strided_int64_metadata():
    _require_native()
    ops = hetero.load("torch")
    gen = torch.Generator().manual_seed(1)
    q, k_cache, v_cache, meta = _layout(gen, [2, 1], [50, 9], 4, 2, 32, 32, 8)
    wide = torch.randn(q.shape[0], 4, 64, generator=gen)
    wide[:, :, :32] = q  # a query whose rows are strided
    meta64 = AttentionMeta(
        meta.query_start_loc.long(), meta.seq_lens.long(), meta.block_table.long(), meta.max_query_len, meta.max_seq_len
    )
    got = ops.paged_attention(wide[:, :, :32], k_cache, v_cache, meta64, scale=0.2)
    torch.testing.assert_close(got, ops.paged_attention(q, k_cache, v_cache, meta, scale=0.2))
    empty = AttentionMeta.build([], [], torch.zeros(0, 3, dtype=torch.int32))
    assert ops.paged_attention(q[:0], k_cache, v_cache, empty, scale=0.2).shape == (0, 4, 32)


@pytest.mark.parametrize(
    "defect",
    [
        "block id past the cache",
        "negative block id",
        "seq_lens past the table",
        "negative seq_lens",
        "query_start_loc out of order",
    ],
)
def test_unchecked_metadata_reads_nothing_outside_the_cache(defect):
    """Validation off, a malformed layout gives undefined numbers but no out-of-bounds read: block ids,
    lengths and row starts are clamped into the tensors; rows no sequence covers get 0."""
    _require_native()
    gen = torch.Generator().manual_seed(2)
    q, k_cache, v_cache, meta = _layout(gen, [3, 1], [40, 20], 4, 2, 32, 32, 16)
    table, lens, starts = meta.block_table.clone(), meta.seq_lens.clone(), meta.query_start_loc.clone()
    if defect == "block id past the cache":
        table[1, 0] = 1 << 30
    elif defect == "negative block id":
        table[0, 1] = -(1 << 30)
    elif defect == "seq_lens past the table":
        lens[0] = 1 << 30
    elif defect == "negative seq_lens":
        lens[1] = -5
    else:
        starts[2] = 2  # [0, 3, 2]: the last sequence ends before it starts
    bad = AttentionMeta(starts, lens, table, meta.max_query_len, meta.max_seq_len)
    out = hetero.load("torch", validate=False).paged_attention(q, k_cache, v_cache, bad, scale=0.2)
    assert out.shape == (4, 4, 32)
    if defect == "query_start_loc out of order":
        assert torch.equal(out[3], torch.zeros(4, 32))  # row 3 belongs to no sequence now
    with pytest.raises(hetero.OpError, match="paged_attention: argument 'meta"):
        hetero.load("torch").paged_attention(q, k_cache, v_cache, bad, scale=0.2)


def test_native_write_kv_skips_negative_and_out_of_range_slots():
    _require_native()
    gen = torch.Generator().manual_seed(3)
    k_cache, v_cache = torch.randn(4, 8, 2, 32, generator=gen), torch.randn(4, 8, 2, 16, generator=gen)
    qkv = torch.randn(5, 2, 64, generator=gen)
    key, value = qkv[:, :, :32], qkv[:, :, 32:48]  # strided rows, as a fused projection's split gives
    slots = torch.tensor([3, -1, 31, 0, 1 << 40])
    want_k, want_v = k_cache.clone(), v_cache.clone()
    for t, s in enumerate(slots.tolist()):
        if 0 <= s < 32:
            want_k[s // 8, s % 8], want_v[s // 8, s % 8] = key[t], value[t]
    hetero.load("torch", validate=False).write_kv(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


def test_native_ops_compile_into_one_graph_equal_to_eager():
    """A decode layer (write, then attend) compiles fullgraph over the native ops, at two batch sizes."""
    _require_native()
    ops = hetero.load("torch", validate=False)

    def layer(q, k, v, k_cache, v_cache, slots, meta):
        ops.write_kv(k, v, k_cache, v_cache, slots)
        return ops.paged_attention(q, k_cache, v_cache, meta, scale=0.2)

    compiled = torch.compile(layer, fullgraph=True)
    gen = torch.Generator().manual_seed(4)
    for lens in ([5, 40, 33], [70, 2, 64, 9, 12]):
        q, k_cache, v_cache, meta = _layout(gen, [1] * len(lens), lens, 4, 2, 32, 32, 16)
        k, v = torch.randn(len(lens), 2, 32, generator=gen), torch.randn(len(lens), 2, 32, generator=gen)
        table = meta.block_table.long()
        last = torch.tensor(lens) - 1
        slots = table[torch.arange(len(lens)), last // 16] * 16 + last % 16
        caches = (k_cache.clone(), v_cache.clone())
        want = layer(q, k, v, *caches, slots, meta)
        got = compiled(q, k, v, k_cache, v_cache, slots, meta)
        assert torch.equal(got, want)
        torch.testing.assert_close(k_cache, caches[0], rtol=0, atol=0, equal_nan=True)  # unowned slots hold NaN
