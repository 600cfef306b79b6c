"""The Triton indexer_topk over compressed keys (spec 1.8's ``compress_ratio``) and the Triton backend's route
with spec 1.8's options (``scoring="sqrtsoftplus"``, ``fixed_ids``), through Triton's interpreter on CPU tensors.

The indexer runs with the interpreter's tuning (big tiles) and with GPU-sized tiles shrunk further (several
key spans, selection tiles and workspace chunks per call). Its inputs are grid values (``dsa_draw.grid``):
every evaluation computes the same float32 scores, so the sets must match the reference's exactly, ties
included.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hetero.errors import OpError
from hetero.spec import AttentionMeta
from hetero.verify.inputs.dsa_draw import fp8_exact_keys, fp8_format, grid, index_weights, key_pool
from hetero_cpu_ref import dsa as ref
from hetero_cpu_ref import moe as ref_moe

_SMALL = {"indexer_topk": {"SPAN": 16, "BLOCK_N": 16, "FP8_BLOCK_N": 16, "SELECT_BLOCK": 16, "WORKSPACE": 40}}
M = 4


@pytest.fixture(params=["interpreter", "small-tiles"])
def tune(request, triton_backend):
    from hetero.kernels.tuning import Tuning, TuningTable

    if request.param == "interpreter":
        return triton_backend.tune
    return Tuning(TuningTable(vendor="test", archs={"small": _SMALL}), "small", interpreted=True)


def _indexer(q, w, cache, meta, topk, tune, **kw):
    from hetero.kernels import dsa

    return dsa.indexer_topk(q, w, cache, meta, topk=topk, compress_ratio=M, tuning=tune, **kw)


def _meta(query_lens, seq_lens, bs, nb, g) -> AttentionMeta:
    """Block tables of the compressed entries (seq_lens // M per sequence), distinct shuffled ids, one spare column."""
    cols = max(-(-(s // M) // bs) for s in seq_lens) + 1
    ids = torch.randperm(nb, generator=g)[: len(seq_lens) * cols].reshape(len(seq_lens), cols)
    return AttentionMeta.build(query_lens, seq_lens, ids)


def _same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == torch.int32 and got.shape == want.shape
    assert [sorted(r) for r in got.tolist()] == [sorted(r) for r in want.tolist()]


_CASES = {  # (query lens, token counts): prefill from 0 (early rows see nothing), chunked across window edges, decode
    "prefill": ([23], [23]),
    "chunked": ([6, 5], [47, 14]),
    "decode": ([1, 1, 1, 1], [61, 3, 4, 30]),
}


@pytest.mark.parametrize("case", list(_CASES))
@pytest.mark.parametrize("fmt", ["bfloat16", "fp8", "ties"])
def test_compressed_indexer_matches_reference(tune, case, fmt):
    g = torch.Generator().manual_seed(11)
    query_lens, seq_lens = _CASES[case]
    bs, hi, nb = 3, 4, 24
    d = 128 if fmt == "fp8" else 32
    meta = _meta(query_lens, seq_lens, bs, nb, g)
    t = sum(query_lens)
    q, w = grid(g, (t, hi, d), torch.bfloat16 if fmt == "bfloat16" else torch.float32), index_weights(g, t, hi)
    scale = None
    if fmt == "fp8":
        cache, scale = fp8_format(fp8_exact_keys(g, (nb, bs, d)))
    elif fmt == "ties":
        cache = key_pool(g, (nb, bs, d), 3, torch.float32)
    else:
        cache = grid(g, (nb, bs, d), torch.bfloat16)
    for topk in (1, 5, 16):
        got = _indexer(q, w, cache, meta, topk, tune, index_scale=scale)
        _same(got, ref.indexer_topk(q, w, cache, meta, topk=topk, index_scale=scale, compress_ratio=M))


def test_rows_before_the_first_window_closes_see_nothing(tune):
    g = torch.Generator().manual_seed(12)
    meta = _meta([5, 1], [5, 2], 2, 6, g)  # positions 0..4 and 1: only position 3 and 4 see entry 0
    q, w, cache = grid(g, (6, 2, 16), torch.float32), index_weights(g, 6, 2), torch.full((6, 2, 16), float("nan"))
    cache[meta.block_table[0, 0], 0] = grid(g, (16,), torch.float32)  # the one written entry; the rest NaN
    got = _indexer(q, w, cache, meta, 3, tune)
    assert got.tolist() == [[-1] * 3] * 3 + [[0, -1, -1]] * 2 + [[-1] * 3]


def test_metadata_left_unchecked_reads_inside_the_cache(tune):
    """Validation off: seq_lens past the table and block ids past the cache are clamped, never read outside."""
    g = torch.Generator().manual_seed(13)
    meta = _meta([2, 1], [9, 13], 2, 6, g)
    meta.block_table[1, 0] = 99  # masked: reads as a zero key
    meta.seq_lens[0] = 400  # past what the 3-column table holds
    meta = dataclasses.replace(meta, max_seq_len=400)
    q, w, cache = grid(g, (3, 2, 16), torch.float32), index_weights(g, 3, 2), grid(g, (5, 2, 16), torch.float32)
    got = _indexer(q, w, cache, meta, 8, tune)
    assert got.shape == (3, 8) and int(got.max()) < 2 * meta.block_table.shape[1]


def test_compress_ratio_is_checked(tune):
    meta = AttentionMeta.build([1], [8], [[0]])
    q, w, cache = torch.randn(1, 2, 16), torch.rand(1, 2), torch.randn(1, 2, 16)
    from hetero.kernels import dsa

    for bad in (0, 2.0, True):
        with pytest.raises(OpError, match="compress_ratio"):
            dsa.indexer_topk(q, w, cache, meta, topk=2, compress_ratio=bad, tuning=tune)


def test_backend_route_sqrtsoftplus_and_fixed_ids(triton_backend):
    g = torch.Generator().manual_seed(14)
    logits, bias = torch.randn(7, 32, generator=g).bfloat16(), torch.randn(32, generator=g) * 0.2
    fixed = torch.stack([torch.randperm(32, generator=g)[:4] for _ in range(7)]).to(torch.int32)
    for kw in (
        dict(scoring="sqrtsoftplus", correction_bias=bias, routed_scaling_factor=1.5),
        dict(scoring="sqrtsoftplus", fixed_ids=fixed, routed_scaling_factor=1.5),
        dict(scoring="softmax", fixed_ids=fixed.long(), renormalize=False),
    ):
        w, ids = triton_backend.route(logits, top_k=4, **kw)
        want_w, want_ids = ref_moe.route(logits, top_k=4, **kw)
        assert torch.equal(ids, want_ids) and ids.dtype == torch.int32
        torch.testing.assert_close(w, want_w, rtol=1e-6, atol=1e-7)
    # validation off: an id past E is clamped for the gather (undefined result), never read outside the scores
    w, _ = triton_backend.route(logits, top_k=4, fixed_ids=fixed + 100)
    assert torch.isfinite(w).all()
    with pytest.raises(OpError, match="correction_bias"):
        triton_backend.route(logits, top_k=4, fixed_ids=fixed, correction_bias=bias)
