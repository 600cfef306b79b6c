"""The Triton DSA kernels (write_index_k, indexer_topk, mla_attention(topk_indices=...)) against the
reference and float64 formulas, through Triton's interpreter on CPU tensors.

Each runs with the interpreter's tuning (big tiles) and with GPU-sized tiles shrunk further
(several key spans, selection tiles and workspace chunks per call), so every loop of the
kernels runs more than once.
"""

from __future__ import annotations

import pytest
import torch

from hetero.errors import OpError
from hetero.spec import AttentionMeta
from hetero_cpu_ref import attention as ref_att
from hetero_cpu_ref import dsa as ref

FP8 = torch.float8_e4m3fn
_SMALL = {
    "indexer_topk": {"SPAN": 32, "BLOCK_N": 16, "FP8_BLOCK_N": 16, "SELECT_BLOCK": 16, "WORKSPACE": 40},
    "mla_sparse": {"BLOCK_H": 16, "BLOCK_N": 16},
}


@pytest.fixture(params=["interpreter", "small-tiles"])
def tune(request, triton_backend):
    from hetero.kernels.tuning import Tuning, TuningTable

    if request.param == "interpreter":
        return triton_backend.tune
    return Tuning(TuningTable(vendor="test", archs={"small": _SMALL}), "small", interpreted=True)


def _dsa():
    from hetero.kernels import dsa

    return dsa


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _meta(query_lens, seq_lens, bs, nb, g) -> AttentionMeta:
    """Block tables of distinct shuffled block ids (one spare column per sequence)."""
    cols = max(-(-s // bs) for s in seq_lens) + 1
    ids = torch.randperm(nb, generator=g)[: len(seq_lens) * cols].reshape(len(seq_lens), cols)
    return AttentionMeta.build(query_lens, seq_lens, ids)


def _scores64(q, w, cache, scale, meta, t, pos_of):
    """float64 scores of row t over its visible keys [0, pos]."""
    b, pos = pos_of[t]
    bs = cache.shape[1]
    j = torch.arange(pos + 1)
    blk = meta.block_table[b].long()[j // bs]
    k = (
        cache[blk, j % bs].double()
        if scale is None
        else (cache[blk, j % bs].double().unflatten(-1, (-1, 128)) * scale[blk, j % bs].double()[..., None]).flatten(-2)
    )
    return (torch.relu(q[t].double() @ k.T) * w[t].double()[:, None]).sum(0)


def _positions(meta):
    qsl, sl = meta.query_start_loc.tolist(), meta.seq_lens.tolist()
    return [(b, sl[b] - (qsl[b + 1] - qsl[b]) + i) for b in range(len(sl)) for i in range(qsl[b + 1] - qsl[b])]


def _assert_same_sets(got, want, scores=None):
    """Row by row the same set of positions, padded with -1 alike; where the sets differ (a near tie of the
    float32 scores), the float64 scores of the two selections must agree."""
    for t, (a, b) in enumerate(zip(got.tolist(), want.tolist())):
        assert sorted(a).count(-1) == sorted(b).count(-1), f"row {t}: {a} vs {b}"
        if sorted(a) != sorted(b):
            s = scores(t)
            sa, sb = (torch.sort(s[[j for j in x if j >= 0]]).values for x in (a, b))
            torch.testing.assert_close(sa, sb, rtol=1e-5, atol=1e-5, msg=f"row {t}: {a} vs {b}")
        assert len(set(a) - {-1}) == len([j for j in a if j >= 0]), f"row {t} repeats a position: {a}"


# ----------------------------------------------------------------------------- write_index_k


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_index_k_plain_copies_and_skips(tune, dtype):
    from hetero.kernels import cache

    g = _gen(1)
    packed = torch.randn(9, 2 * 72, generator=g).to(dtype)
    k = packed[:, ::2]  # a strided view
    idx = torch.randn(5, 4, 72, generator=g).to(dtype)
    slots = torch.randperm(20, generator=g)[:9]
    slots[[1, 6]] = -1
    want = idx.clone()
    ref.write_index_k(k, want, slots)
    cache.write_index_k(k, idx, slots, tuning=tune)
    assert torch.equal(idx, want)


def test_write_index_k_fp8_is_bit_exact(tune):
    from hetero.kernels import cache

    g = _gen(2)
    t, d = 11, 256
    k = torch.randn(t, d, generator=g) * torch.logspace(-6, 3, t)[:, None]  # group maxima from 1e-6 (floored) to 1e3
    k[3, :128] = 0.0
    k[4, 5] = -1e4  # one outlier: most of its group underflows into e4m3's subnormals
    slots = torch.randperm(24, generator=g)[:t]
    slots[7] = -1
    for dtype in (torch.float32, torch.bfloat16):
        got_c = torch.full((6, 4, d), float("nan")).to(FP8)
        got_s = torch.full((6, 4, 2), float("nan"))
        want_c, want_s = got_c.clone(), got_s.clone()
        ref.write_index_k(k.to(dtype), want_c, slots, index_scale=want_s)
        cache.write_index_k(k.to(dtype), got_c, slots, index_scale=got_s, tuning=tune)
        assert torch.equal(got_c.view(torch.uint8), want_c.view(torch.uint8))
        assert torch.equal(got_s.nan_to_num(7.0), want_s.nan_to_num(7.0))


def test_fp8_rounding_covers_every_code_ties_and_subnormals(tune):
    """A group whose amax is 448 has scale 1: its values are rounded directly. Every e4m3 value, every
    midpoint between neighbours (ties to even) and the floats just either side of each midpoint."""
    from hetero.kernels import cache

    codes = torch.arange(0, 127, dtype=torch.uint8).view(FP8).float()  # 0 .. 448, subnormals included
    mids = (codes[1:] + codes[:-1]) / 2
    vals = torch.cat(
        [
            codes,
            mids,
            torch.nextafter(mids, torch.zeros(())),
            torch.nextafter(mids, torch.full((), 1e9)),
            torch.tensor([1e-30, 2.0**-10, 3 * 2.0**-11]),
        ]
    )
    vals = torch.cat([vals, -vals])
    per = 127
    rows = -(-vals.numel() // per)
    k = torch.zeros(rows * per)
    k[: vals.numel()] = vals
    k = torch.cat([k.reshape(rows, per), torch.full((rows, 1), 448.0)], 1)
    got_c, got_s = torch.zeros(rows, 1, 128, dtype=FP8), torch.zeros(rows, 1, 1)
    cache.write_index_k(k, got_c, torch.arange(rows), index_scale=got_s, tuning=tune)
    assert torch.equal(got_s, torch.ones(rows, 1, 1))
    assert torch.equal(got_c.view(torch.uint8).reshape(rows, 128), k.to(FP8).view(torch.uint8))


# ----------------------------------------------------------------------------- indexer_topk

_CASES = {  # (query lens, seq lens): prefill, chunked prefill, decode, mixed
    "prefill": ([13], [13]),
    "chunked": ([5, 3], [21, 9]),
    "decode": ([1, 1, 1], [40, 1, 17]),
}


@pytest.mark.parametrize("case", list(_CASES))
@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "fp8"])
def test_indexer_topk_matches_reference(tune, case, fmt):
    g = _gen(3)
    query_lens, seq_lens = _CASES[case]
    bs, hi = 4, 5
    d = 128 if fmt == "fp8" else 48
    dtype = torch.bfloat16 if fmt == "bfloat16" else torch.float32
    meta = _meta(query_lens, seq_lens, bs, 40, g)
    t = sum(query_lens)
    q = torch.randn(t, hi, d, generator=g).to(dtype)
    w = torch.randn(t, hi, generator=g)
    keys = torch.randn(40, bs, d, generator=g)
    scale = None
    cache = keys.to(dtype)
    if fmt == "fp8":
        cache, scale = torch.zeros(40, bs, d, dtype=FP8), torch.zeros(40, bs, 1)
        ref.write_index_k(keys.flatten(0, 1), cache, torch.arange(40 * bs), index_scale=scale)
    pos_of = _positions(meta)
    for topk in (1, 6, 64):
        got = _dsa().indexer_topk(q, w, cache, meta, topk=topk, index_scale=scale, tuning=tune)
        assert got.dtype == torch.int32 and got.shape == (t, topk)
        want = ref.indexer_topk(q, w, cache, meta, topk=topk, index_scale=scale)
        _assert_same_sets(got, want, lambda r: _scores64(q, w, cache, scale, meta, r, pos_of))


def test_indexer_topk_exact_ties_go_to_smaller_positions(tune):
    """Keys repeated across positions score exactly alike, and keys every head sees negatively score
    exactly 0: the selection keeps the larger score, then the smaller position, bit for bit.

    Every value is a multiple of 1/64 (weights of 1/16) small enough that each product and partial
    sum is exact in float32: a tie stays a tie whatever order or alignment a machine's dot product
    sums in (numpy's float32 dot under the interpreter rounds by alignment on some CPUs)."""
    g = _gen(4)
    bs, hi, d = 4, 3, 32

    def dyadic(x, step):
        return torch.round(x * step) / step

    base = dyadic(torch.randn(3, d, generator=g), 8)
    base[2] = -base[2]
    pattern = torch.randint(0, 3, (30,), generator=g)
    q = dyadic(base[0].repeat(6, hi, 1) + 0.05 * torch.randn(6, hi, d, generator=g), 64)
    q[:, 0] = base[1]
    w = dyadic(torch.rand(6, hi, generator=g) + 0.1, 16)  # positive: keys opposed to every head score exactly 0
    meta = _meta([6], [30], bs, 10, g)
    cache = torch.zeros(10, bs, d)
    for j in range(30):
        cache[meta.block_table[0, j // bs], j % bs] = base[pattern[j]]
    for topk in (1, 4, 11, 29):
        got = _dsa().indexer_topk(q, w, cache, meta, topk=topk, tuning=tune)
        want = ref.indexer_topk(q, w, cache, meta, topk=topk)
        assert [sorted(r) for r in got.tolist()] == [sorted(r) for r in want.tolist()]


def test_indexer_topk_selection_is_exact_on_crafted_scores(tune):
    """Two heads with q = +e0 / -e0 and weights +1 / -1 make score[j] = k[j, 0] exactly, so the selection
    sees chosen float32 scores: neighbours one ulp apart, negatives, zeros of both signs, repeats."""
    g = _gen(8)
    n, bs = 150, 8
    base = torch.tensor([3.0, -2.5, 0.0, 1e-30, -1e30, 7.25])
    s = base[torch.randint(0, 6, (n,), generator=g)]
    ulps = torch.randint(-2, 3, (n,), generator=g)
    for _ in range(2):  # +-2 ulps around the base values
        s = torch.where(ulps > 0, torch.nextafter(s, torch.tensor(float("inf"))), s)
        s = torch.where(ulps < 0, torch.nextafter(s, torch.tensor(float("-inf"))), s)
        ulps = ulps - ulps.sign()
    s[::7] = -0.0
    meta = _meta([4], [n], bs, 25, g)
    cache = torch.zeros(25, bs, 16)
    j = torch.arange(n)
    cache[meta.block_table[0].long()[j // bs], j % bs, 0] = s
    q = torch.zeros(4, 2, 16)
    q[:, 0, 0], q[:, 1, 0] = 1.0, -1.0
    w = torch.tensor([[1.0, -1.0]]).repeat(4, 1)
    for topk in (1, 2, 37, 146, 148):
        got = _dsa().indexer_topk(q, w, cache, meta, topk=topk, tuning=tune)
        for r, row in enumerate(got.tolist()):
            pos = n - 4 + r
            order = sorted(range(pos + 1), key=lambda i: (-float(s[i]), i))  # -0.0 == 0.0: by position
            keep = min(topk, pos + 1)
            assert sorted(x for x in row if x >= 0) == sorted(order[:keep]), f"row {r}, topk {topk}"
            assert row.count(-1) == topk - keep


def test_indexer_topk_rejects_bad_arguments(tune):
    meta = AttentionMeta.build([2], [2], [[0]])
    q, w, cache = torch.randn(2, 4, 16), torch.randn(2, 4), torch.randn(1, 4, 16)
    with pytest.raises(OpError, match="topk"):
        _dsa().indexer_topk(q, w, cache, meta, topk=0, tuning=tune)
    with pytest.raises(OpError, match="weights"):
        _dsa().indexer_topk(q, w.half(), cache, meta, topk=2, tuning=tune)
    with pytest.raises(OpError, match="q"):
        _dsa().indexer_topk(q.double(), w, cache.double(), meta, topk=2, tuning=tune)
    with pytest.raises(OpError, match="index_cache"):
        _dsa().indexer_topk(q, w, cache.to(FP8), meta, topk=2, index_scale=torch.ones(1, 4, 1), tuning=tune)


# ----------------------------------------------------------------------------- sparse mla_attention


def _mla_inputs(g, t, h, lkv, r, nb, bs, dtype):
    return (
        torch.randn(t, h, lkv, generator=g).to(dtype),
        torch.randn(t, h, r, generator=g).to(dtype),
        torch.randn(nb, bs, lkv, generator=g).to(dtype),
        torch.randn(nb, bs, r, generator=g).to(dtype),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [True, False])
def test_sparse_mla_matches_reference(tune, dtype, causal):
    from hetero.kernels import attention

    g = _gen(5)
    meta = _meta([5, 1, 3], [12, 7, 3], 4, 16, g)
    t, h = 9, 20  # two head blocks of 16 with the small tiles
    qn, qp, ckv, kpe = _mla_inputs(g, t, h, 48, 16, 16, 4, dtype)
    idx = torch.randint(-3, 14, (t, 23), generator=g, dtype=torch.int32)
    idx[2] = -1  # a row with nothing: out 0, lse -inf
    idx[4, :12] = torch.arange(12, dtype=torch.int32)  # every position, duplicates only among invalid ones
    idx[4, 12:] = -1
    for i, row in enumerate(idx):  # one entry per position (duplicates are undefined)
        seen: set[int] = set()
        for c, j in enumerate(row.tolist()):
            idx[i, c] = j if j not in seen else -1
            seen.add(j)
    out = torch.full((t, h, 48), float("nan")).to(dtype)
    got, lse = attention.mla_attention(
        qn,
        qp,
        ckv,
        kpe,
        meta,
        scale=0.17,
        causal=causal,
        return_lse=True,
        topk_indices=idx.long() if causal else idx,
        tuning=tune,
    )
    out.copy_(got)
    want, want_lse = ref_att.mla_attention(
        qn, qp, ckv, kpe, meta, scale=0.17, causal=causal, return_lse=True, topk_indices=idx
    )
    tol = {"rtol": 2e-5, "atol": 2e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(out.float(), want.float(), **tol)
    torch.testing.assert_close(lse, want_lse, rtol=2e-5, atol=2e-5)
    assert (lse[2] == float("-inf")).all() and (out[2] == 0).all()


def test_sparse_mla_with_every_position_is_dense_mla(tune):
    from hetero.kernels import attention

    g = _gen(6)
    meta = _meta([4, 2], [9, 2], 4, 8, g)
    qn, qp, ckv, kpe = _mla_inputs(g, 6, 3, 32, 16, 8, 4, torch.float32)
    idx = torch.arange(16, dtype=torch.int32).flip(0).repeat(6, 1)  # every position, most rows some invisible ones
    dense = attention.mla_attention(qn, qp, ckv, kpe, meta, scale=0.3, return_lse=True, tuning=tune)
    sparse = attention.mla_attention(qn, qp, ckv, kpe, meta, scale=0.3, return_lse=True, topk_indices=idx, tuning=tune)
    for a, b in zip(sparse, dense):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5)


def test_sparse_mla_rejects_bad_indices(tune):
    from hetero.kernels import attention

    meta = AttentionMeta.build([2], [2], [[0]])
    args = (torch.randn(2, 2, 16), torch.randn(2, 2, 16), torch.randn(1, 4, 16), torch.randn(1, 4, 16), meta)
    for bad, match in (
        (torch.zeros(3, 4, dtype=torch.int32), "topk_indices"),
        (torch.zeros(2, 4), "topk_indices"),
        (torch.zeros(2, 0, dtype=torch.int32), "K >= 1"),
    ):
        with pytest.raises(OpError, match=match):
            attention.mla_attention(*args, scale=1.0, topk_indices=bad, tuning=tune)


# ----------------------------------------------------------------------------- through the backend


def test_backend_pipeline_indexer_then_sparse_mla(triton_backend):
    """write_index_k, indexer_topk and sparse mla_attention as a DSA layer chains them, with the fp8
    cache; supports() declines only what the kernels lack (float64 tensor-core dots)."""
    g = _gen(7)
    meta = _meta([3, 1], [8, 5], 4, 8, g)
    k = torch.randn(13, 128, generator=g)
    cache, scale = torch.zeros(8, 4, 128, dtype=FP8), torch.zeros(8, 4, 1)
    slots = torch.cat(
        [
            meta.block_table[0, :2].long()[:, None] * 4 + torch.arange(4),
            meta.block_table[1, :2].long()[:, None] * 4 + torch.arange(4),
        ]
    ).flatten()[:13]
    triton_backend.write_index_k(k, cache, slots, index_scale=scale)
    idx = triton_backend.indexer_topk(
        torch.randn(4, 8, 128, generator=g), torch.rand(4, 8, generator=g), cache, meta, topk=3, index_scale=scale
    )
    assert idx[:, :3].ge(0).all()
    qn, qp, ckv, kpe = _mla_inputs(g, 4, 2, 32, 16, 8, 4, torch.float32)
    out = triton_backend.mla_attention(qn, qp, ckv, kpe, meta, scale=0.2, topk_indices=idx)
    torch.testing.assert_close(
        out, ref_att.mla_attention(qn, qp, ckv, kpe, meta, scale=0.2, topk_indices=idx), rtol=2e-5, atol=2e-5
    )
    assert triton_backend.supports("indexer_topk", dtype="float64") is not None
    assert triton_backend.supports("indexer_topk", dtype="bfloat16") is None
    assert triton_backend.supports("write_index_k", dtype="float32") is None
