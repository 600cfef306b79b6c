"""The reference DSA ops (write_index_k, indexer_topk, sparse mla_attention) against independent formulations.

The independent sides: keys laid out contiguously by plain Python loops over the block table;
the indexer's scores as one dense float64 matrix with a causal mask and ``torch.topk`` over it
(inputs drawn continuous, so no ties); sparse absorbed MLA as the expanded (non-absorbed)
attention of Hugging Face's DeepSeek-V3.2, per head, through
``torch.nn.functional.scaled_dot_product_attention`` with a boolean mask built from the spec's
rule one (row, key) pair at a time; the fp8 key format from float32 numbers written out per group.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hetero.errors import OpError
from hetero.spec import OPS, AttentionMeta
from hetero_cpu_ref import attention, dsa

FP8 = torch.float8_e4m3fn


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(g: torch.Generator, *shape: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def _paged(g: torch.Generator, seqs: list[tuple[int, int]], bs: int, nb: int) -> AttentionMeta:
    """Metadata of sequences (query rows, keys) over random distinct blocks of a cache of nb."""
    need = [-(-L // bs) for _, L in seqs]
    ids = torch.randperm(nb, generator=g).tolist()
    width, rows, at = max(need) + 1, [], 0
    for k in need:
        rows.append(ids[at : at + k] + [0] * (width - k))
        at += k
    return AttentionMeta.build([n for n, _ in seqs], [L for _, L in seqs], rows)


def _contiguous(cache: torch.Tensor, meta: AttentionMeta, b: int) -> torch.Tensor:
    """Sequence b's keys [L, ...], read one position at a time through the block table."""
    bs, length = cache.shape[1], int(meta.seq_lens[b])
    return torch.stack([cache[int(meta.block_table[b, j // bs]), j % bs] for j in range(length)])


def _rows(meta: AttentionMeta):
    """(sequence, first row, rows, keys) per sequence."""
    qsl = meta.query_start_loc.tolist()
    for b, length in enumerate(meta.seq_lens.tolist()):
        yield b, qsl[b], qsl[b + 1] - qsl[b], length


@pytest.mark.parametrize("op, module", [("write_index_k", dsa), ("indexer_topk", dsa), ("mla_attention", attention)])
def test_signature_matches_spec(op, module):
    assert OPS[op].check_signature(getattr(module, op)) is None


# --------------------------------------------------------------------------- indexer_topk


def _dense_topk(q, w, keys, n, topk):
    """torch.topk over the float64 score matrix of one sequence's last n rows, future keys -inf."""
    length = keys.shape[0]
    scores = (torch.einsum("nhd,ld->nhl", q, keys).clamp_min(0) * w[:, :, None]).sum(1)
    pos = torch.arange(n)[:, None] + (length - n)
    scores = scores.masked_fill(torch.arange(length)[None, :] > pos, float("-inf"))
    vals, idx = scores.topk(min(topk, length), dim=1)
    return [sorted(i for i, v in zip(r.tolist(), vr.tolist()) if v != float("-inf")) for r, vr in zip(idx, vals)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("topk", [1, 7, 64])
def test_indexer_equals_torch_topk_over_dense_causal_scores(dtype, topk):
    g = _gen(topk)
    seqs, bs, hi, d = [(5, 40), (1, 90), (30, 30), (0, 12), (1, 1)], 8, 4, 32
    meta = _paged(g, seqs, bs, 40)
    cache = _randn(g, 40, bs, d, dtype=dtype)
    t = sum(n for n, _ in seqs)
    q, w = _randn(g, t, hi, d, dtype=dtype), torch.rand(t, hi, generator=g, dtype=torch.float64).to(dtype)
    got = dsa.indexer_topk(q, w.float() if dtype == torch.float32 else w, cache, meta, topk=topk)
    assert got.dtype == torch.int32 and got.shape == (t, topk)
    for b, a, n, length in _rows(meta):
        want = _dense_topk(q[a : a + n].double(), w[a : a + n].double(), _contiguous(cache, meta, b).double(), n, topk)
        for i in range(n):
            row = got[a + i].tolist()
            keep = min(topk, length - n + i + 1)
            assert sorted(x for x in row if x >= 0) == want[i] and row.count(-1) == topk - keep, (b, i)


def test_indexer_ties_go_to_the_smaller_position():
    """Keys 0..9 all equal: every score ties, so the top 4 are positions 0..3 whatever the row."""
    g = _gen(1)
    cache = _randn(g, 1, 16, 8).float().expand(1, 16, 8).clone()
    cache[0, :10] = cache[0, 0]
    meta = AttentionMeta.build([3], [10], [[0]])
    got = dsa.indexer_topk(torch.randn(3, 2, 8, generator=g), torch.rand(3, 2, generator=g), cache, meta, topk=4)
    assert [sorted(r) for r in got.tolist()] == [[0, 1, 2, 3]] * 3


def test_indexer_fp8_cache_equals_the_plain_cache_of_its_dequantized_keys():
    g = _gen(2)
    meta = _paged(g, [(3, 300), (1, 150)], 16, 40)
    keys = _randn(g, 40, 16, 256, dtype=torch.float32)
    q8, scale = torch.empty(40 * 16, 256, dtype=FP8), torch.empty(40 * 16, 2)
    dsa.write_index_k(
        keys.reshape(-1, 256), q8.view(40, 16, 256), torch.arange(40 * 16), index_scale=scale.view(40, 16, 2)
    )
    plain = (q8.float().reshape(-1, 2, 128) * scale[..., None]).reshape(40, 16, 256)
    q, w = _randn(g, 4, 8, 256, dtype=torch.float32), torch.rand(4, 8, generator=g)
    fp8 = dsa.indexer_topk(q, w, q8.view(40, 16, 256), meta, topk=100, index_scale=scale.view(40, 16, 2))
    assert torch.equal(fp8.sort(1).values, dsa.indexer_topk(q, w, plain, meta, topk=100).sort(1).values)


# --------------------------------------------------------------------------- write_index_k


def test_write_index_k_plain_copies_and_skips_minus_one():
    g = _gen(3)
    k, cache = _randn(g, 4, 128, dtype=torch.bfloat16), _randn(g, 3, 4, 128, dtype=torch.bfloat16)
    before = cache.clone()
    dsa.write_index_k(k, cache, torch.tensor([5, -1, 0, 11]))
    flat, old = cache.view(12, 128), before.view(12, 128)
    assert torch.equal(flat[5], k[0]) and torch.equal(flat[0], k[2]) and torch.equal(flat[11], k[3])
    untouched = [s for s in range(12) if s not in (0, 5, 11)]
    assert torch.equal(flat[untouched], old[untouched])


def _fp8_expected(row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The spec's formula for one token, group by group, in float32 scalars."""
    q, s = [], []
    for group in row.float().split(128):
        amax = torch.maximum(group.abs().max(), torch.tensor(1e-4, dtype=torch.float32))
        scale = amax / torch.tensor(448.0, dtype=torch.float32)
        q.append((group / scale).clamp(-448, 448).to(FP8))
        s.append(scale)
    return torch.cat(q), torch.stack(s)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_write_index_k_fp8_bits_follow_the_spec_in_float32(dtype):
    g = _gen(4)
    k = _randn(g, 5, 256, dtype=dtype)
    k[1, :128] *= 1e-5  # amax under the floor
    k[2] *= 300.0
    cache, scale = torch.zeros(2, 4, 256, dtype=FP8), torch.full((2, 4, 2), float("nan"))
    dsa.write_index_k(k, cache, torch.tensor([6, 0, -1, 3, 7]), index_scale=scale)
    for t, slot in ((0, 6), (1, 0), (3, 3), (4, 7)):
        q, s = _fp8_expected(k[t].float() if dtype == torch.float64 else k[t])
        assert torch.equal(cache.view(8, 256)[slot].view(torch.uint8), q.view(torch.uint8)), t
        assert torch.equal(scale.view(8, 2)[slot], s), t
    assert torch.isnan(scale.view(8, 2)[[1, 2, 4, 5]]).all()  # slots not named are untouched
    assert float(scale.view(8, 2)[0, 0]) == float(torch.tensor(1e-4, dtype=torch.float32) / 448)


def test_write_index_k_fp8_rounds_halfway_values_to_even():
    k = torch.full((1, 128), 0.5 / 256)
    k[0, 0] = 1.75  # scale exactly 2**-8
    k[0, 1:5] = torch.tensor([17.0, 19.0, 9.5, -8.5]) / 256  # halfway between e4m3 neighbours
    cache, scale = torch.zeros(1, 1, 128, dtype=FP8), torch.zeros(1, 1, 1)
    dsa.write_index_k(k, cache, torch.tensor([0]), index_scale=scale)
    assert float(scale) == 2.0**-8
    assert cache[0, 0, :5].float().tolist() == [448.0, 16.0, 20.0, 10.0, -8.0]


# --------------------------------------------------------------------------- sparse mla_attention


def _sparse_rows(g, seqs, k):
    rows = []
    for n, length in seqs:
        for i in range(n):
            pos = length - n + i
            row = torch.full((k,), -1)
            picked = torch.randperm(pos + 1, generator=g)[: min(k, pos + 1)]
            row[: len(picked)] = picked
            if pos + 1 < length and len(picked) < k:
                row[-1] = pos + 1  # visible to no row at pos: skipped
            rows.append(row[torch.randperm(k, generator=g)])
    return torch.stack(rows).to(torch.int32)


def _visible(rows: torch.Tensor, n: int, length: int) -> torch.Tensor:
    """The spec's rule: key j is attended iff row lists it and 0 <= j <= pos, pair by pair."""
    listed = [set(r) for r in rows.tolist()]
    return torch.tensor(
        [[j in listed[i] and j <= length - n + i for j in range(length)] for i in range(n)], dtype=torch.bool
    )


def test_sparse_absorbed_mla_equals_expanded_masked_attention():
    """HF DeepSeek-V3.2's form: per head k = W_UK c_kv | k_pe, v = W_UV c_kv, SDPA over the listed keys."""
    g = _gen(5)
    h, lkv, r, nope, dv, bs = 4, 64, 16, 24, 20, 8
    seqs = [(1, 50), (6, 33), (3, 3)]
    meta = _paged(g, seqs, bs, 20)
    ckv, kpe = _randn(g, 20, bs, lkv), _randn(g, 20, bs, r)
    t = sum(n for n, _ in seqs)
    w_uk, w_uv = _randn(g, h, nope, lkv) * 0.2, _randn(g, h, dv, lkv) * 0.2
    q_n, q_pe, scale = _randn(g, t, h, nope), _randn(g, t, h, r), (nope + r) ** -0.5
    rows = _sparse_rows(g, seqs, 12)
    q_lat = torch.einsum("thn,hnl->thl", q_n, w_uk)
    out, lse = attention.mla_attention(q_lat, q_pe, ckv, kpe, meta, scale=scale, return_lse=True, topk_indices=rows)
    got = torch.einsum("thl,hvl->thv", out, w_uv)
    for b, a, n, length in _rows(meta):
        c, kp = _contiguous(ckv, meta, b), _contiguous(kpe, meta, b)
        key = torch.cat([torch.einsum("hnl,sl->hsn", w_uk, c), kp[None].expand(h, -1, -1)], dim=-1)
        query = torch.cat([q_n[a : a + n], q_pe[a : a + n]], dim=-1).transpose(0, 1)  # [h, n, nope + r]
        mask = _visible(rows[a : a + n], n, length)
        want = F.scaled_dot_product_attention(
            query, key, torch.einsum("hvl,sl->hsv", w_uv, c), attn_mask=mask, scale=scale
        )
        torch.testing.assert_close(got[a : a + n], want.transpose(0, 1), atol=1e-10, rtol=1e-10)
        logits = (query @ key.transpose(1, 2) * scale).masked_fill(~mask, float("-inf"))
        torch.testing.assert_close(lse[a : a + n], torch.logsumexp(logits, -1).T.float())


def test_sparse_rows_listing_every_visible_key_equal_dense_mla():
    g = _gen(6)
    seqs = [(4, 20), (1, 9)]
    meta = _paged(g, seqs, 4, 12)
    args = (
        _randn(g, 5, 2, 32, dtype=torch.float32),
        _randn(g, 5, 2, 8, dtype=torch.float32),
        _randn(g, 12, 4, 32, dtype=torch.float32),
        _randn(g, 12, 4, 8, dtype=torch.float32),
        meta,
    )
    rows = torch.stack([torch.randperm(24, generator=g) for _ in range(5)]) - 2  # [-2, 21]: every key, more skipped
    dense = attention.mla_attention(*args, scale=0.2, return_lse=True)
    sparse = attention.mla_attention(*args, scale=0.2, return_lse=True, topk_indices=rows)
    assert torch.equal(dense[0], sparse[0]) and torch.equal(dense[1], sparse[1])


def test_a_sparse_row_with_nothing_visible_gets_zero_and_minus_inf():
    g = _gen(7)
    meta = AttentionMeta.build([2], [6], [[1, 0]])
    rows = torch.tensor([[-1, 5, 1 << 30], [2, -1, -7]], dtype=torch.int64)  # row 0 at pos 4: nothing it may see
    out, lse = attention.mla_attention(
        _randn(g, 2, 3, 16),
        _randn(g, 2, 3, 4),
        _randn(g, 2, 4, 16),
        _randn(g, 2, 4, 4),
        meta,
        scale=0.3,
        return_lse=True,
        topk_indices=rows,
    )
    assert (
        torch.equal(out[0], torch.zeros(3, 16))
        and bool((lse[0] == float("-inf")).all())
        and bool(lse[1].isfinite().all())
    )


# --------------------------------------------------------------------------- OpErrors


@pytest.mark.parametrize(
    "change, arg",
    [
        (dict(topk=0), "topk"),
        (dict(topk=True), "topk"),
        (dict(weights=torch.rand(3, 2, dtype=torch.bfloat16)), "weights"),
        (dict(index_cache=torch.zeros(2, 4, 128, dtype=FP8)), "index_scale"),
        (dict(index_scale=torch.ones(2, 4, 1)), "index_cache"),
        (dict(meta=None), "meta"),
    ],
)
def test_indexer_rejects_bad_arguments_by_name(change, arg):
    args = dict(
        q=torch.randn(3, 2, 128),
        weights=torch.rand(3, 2),
        index_cache=torch.randn(2, 4, 128),
        meta=AttentionMeta.build([3], [6], [[1, 0]]),
        topk=4,
    )
    with pytest.raises(OpError) as info:
        dsa.indexer_topk(**{**args, **change})
    assert info.value.arg == arg


def test_sparse_mla_rejects_malformed_topk_indices():
    meta = AttentionMeta.build([2], [6], [[1, 0]])
    args = (torch.randn(2, 3, 16), torch.randn(2, 3, 4), torch.randn(2, 4, 16), torch.randn(2, 4, 4), meta)
    for bad in (torch.zeros(2, 4), torch.zeros(3, 4, dtype=torch.int32), torch.zeros(2, 0, dtype=torch.int32)):
        with pytest.raises(OpError, match="topk_indices"):
            attention.mla_attention(*args, scale=0.3, topk_indices=bad)
