"""The reference attention ops against independent formulations.

Paged and varlen attention are checked per sequence against
torch.nn.functional.scaled_dot_product_attention (or, for softcap and sinks
which SDPA lacks, an explicit float64 softmax) on KV gathered position by
position, with a mask built by plain Python loops straight from the spec's
visibility rule. Absorbed MLA is checked against the non-absorbed form, merging
against attention over the union of the key sets, and every bad input against
the OpError it must raise.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from hetero.errors import OpError
from hetero.spec import OPS, AttentionMeta
from hetero_cpu_ref import attention as ref

NEG_INF = float("-inf")

#: Output tolerance against the float64 expectation, per input dtype.
TOL = {
    torch.float64: dict(atol=1e-10, rtol=1e-10),
    torch.float32: dict(atol=2e-5, rtol=1e-4),
    torch.bfloat16: dict(atol=3e-2, rtol=3e-2),  # bf16 output rounding (8 bits) of values O(1)
}
#: lse is float32 whatever the input dtype.
LSE_TOL = dict(atol=2e-5, rtol=1e-6)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(gen: torch.Generator, *shape: int, dtype: torch.dtype = torch.float32, std: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * std).to(dtype)


# ----------------------------------------------------------------------------- independent reference


def _mask(n: int, length: int, causal: bool, window: tuple[int, int]) -> torch.Tensor:
    """The spec's visibility rule, evaluated one (row, key) pair at a time."""
    rows = []
    for i in range(n):
        pos = length - n + i
        rows.append(
            [
                (not causal or j <= pos)
                and (window[0] < 0 or j >= pos - window[0])
                and (window[1] < 0 or j <= pos + window[1])
                for j in range(length)
            ]
        )
    return torch.tensor(rows, dtype=torch.bool).reshape(n, length)


def _expected(q, k, v, *, scale, causal=True, window=(-1, -1), softcap=0.0, sinks=None):
    """One sequence in float64: q [n,Hq,D], k [L,Hkv,D], v [L,Hkv,Dv] -> (out [n,Hq,Dv], lse [n,Hq])."""
    q, k, v = q.double(), k.double(), v.double()
    (n, hq, _), (length, hkv, dv) = q.shape, v.shape
    if length == 0:
        return torch.zeros(n, hq, dv, dtype=torch.float64), torch.full((n, hq), NEG_INF, dtype=torch.float64)
    k, v = k.repeat_interleave(hq // hkv, dim=1), v.repeat_interleave(hq // hkv, dim=1)
    qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [H, *, D]
    mask = _mask(n, length, causal, window)
    logits = scale * (qh @ kh.transpose(1, 2))
    if softcap > 0:
        logits = softcap * torch.tanh(logits / softcap)
    masked = logits.masked_fill(~mask, NEG_INF)
    lse = torch.logsumexp(masked, dim=-1).transpose(0, 1)
    if softcap == 0 and sinks is None:
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
    else:
        sink = torch.full((hq,), NEG_INF, dtype=torch.float64) if sinks is None else sinks.double()
        top = torch.maximum(masked.amax(dim=-1), sink[:, None])[..., None]
        num = torch.exp(masked - top)
        den = num.sum(dim=-1, keepdim=True) + torch.exp(sink[:, None, None] - top)
        out = (num / den) @ vh
    out = out.masked_fill(~mask.any(dim=-1)[None, :, None], 0.0)  # the spec's empty-row rule
    return out.transpose(0, 1), lse


def _expected_batch(query, keys, values, starts, **opts):
    outs, lses = [], []
    for b, (k, v) in enumerate(zip(keys, values)):
        o, l = _expected(query[starts[b] : starts[b + 1]], k, v, **opts)
        outs.append(o)
        lses.append(l)
    dv, hq = values[0].shape[2] if values else 0, query.shape[1]
    cat = lambda xs, *rest: torch.cat(xs) if xs else torch.zeros(0, *rest, dtype=torch.float64)  # noqa: E731
    return cat(outs, hq, dv), cat(lses, hq)


# ----------------------------------------------------------------------------- batch builders


def _paged_batch(gen, seqs, hq, hkv, d, dv, bs, dtype):
    """Random query and caches; each sequence's KV lives in random non-contiguous blocks.

    Every cache slot starts random, so an implementation reading past seq_lens or
    a wrong block sees plausible garbage, not zeros. Returns the dense per-sequence KV.
    """
    used = [-(-length // bs) for _, length in seqs]
    nb = sum(used) + 3
    free = iter(torch.randperm(nb, generator=gen).tolist())
    k_cache, v_cache = _randn(gen, nb, bs, hkv, d, dtype=dtype), _randn(gen, nb, bs, hkv, dv, dtype=dtype)
    keys, values, table = [], [], []
    width = max(used, default=0) + 1
    for (_, length), m in zip(seqs, used):
        ids = [next(free) for _ in range(m)]
        table.append(ids + [-1] * (width - m))  # padding entries are never read
        k, v = _randn(gen, length, hkv, d, dtype=dtype), _randn(gen, length, hkv, dv, dtype=dtype)
        for j in range(length):
            k_cache[ids[j // bs], j % bs] = k[j]
            v_cache[ids[j // bs], j % bs] = v[j]
        keys.append(k)
        values.append(v)
    query = _randn(gen, sum(n for n, _ in seqs), hq, d, dtype=dtype)
    meta = AttentionMeta.build([n for n, _ in seqs], [length for _, length in seqs], table)
    return query, k_cache, v_cache, meta, keys, values


def _starts(lengths):
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


#: prefill, decode over a partial last block, chunked prefill, block-aligned prefill, one token.
MIXED = [(6, 6), (1, 37), (5, 21), (16, 32), (1, 1)]


def _check(out, lse, exp_out, exp_lse, dtype):
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert lse.dtype == torch.float32
    torch.testing.assert_close(out.double(), exp_out, **TOL[dtype])
    torch.testing.assert_close(lse.double(), exp_lse, **LSE_TOL)


# ----------------------------------------------------------------------------- signatures


@pytest.mark.parametrize(
    "name", ["write_kv", "paged_attention", "varlen_attention", "write_mla_kv", "mla_attention", "merge_attention"]
)
def test_signature_matches_spec(name):
    assert OPS[name].check_signature(getattr(ref, name)) is None


# ----------------------------------------------------------------------------- paged attention


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "hq,hkv,d", [(4, 4, 64), (8, 2, 128), (16, 2, 64), (8, 1, 128)], ids=["mha", "gqa4", "gqa8", "mqa"]
)
def test_paged_mixed_batch_matches_sdpa(hq, hkv, d, dtype):
    query, kc, vc, meta, keys, values = _paged_batch(_gen(1), MIXED, hq, hkv, d, d, 16, dtype)
    scale = d**-0.5
    out, lse = ref.paged_attention(query, kc, vc, meta, scale=scale, return_lse=True)
    assert out.dtype == dtype and out.shape == (query.shape[0], hq, d)
    _check(out, lse, *_expected_batch(query, keys, values, _starts([n for n, _ in MIXED]), scale=scale), dtype)


@pytest.mark.parametrize(
    "causal,window",
    [(True, (4, -1)), (True, (0, -1)), (False, (3, 2)), (False, (-1, 0)), (False, (-1, -1)), (True, (5, 7))],
)
def test_paged_masks(causal, window):
    seqs = [(6, 6), (1, 37), (5, 21)]
    query, kc, vc, meta, keys, values = _paged_batch(_gen(2), seqs, 8, 2, 64, 64, 8, torch.float64)
    out, lse = ref.paged_attention(query, kc, vc, meta, scale=0.125, causal=causal, window=window, return_lse=True)
    exp = _expected_batch(query, keys, values, _starts([n for n, _ in seqs]), scale=0.125, causal=causal, window=window)
    _check(out, lse, *exp, torch.float64)


@pytest.mark.parametrize(
    "softcap,with_sinks,window", [(20.0, False, (-1, -1)), (0.0, True, (-1, -1)), (5.0, True, (3, -1))]
)
def test_paged_softcap_and_sinks(softcap, with_sinks, window):
    gen = _gen(3)
    query, kc, vc, meta, keys, values = _paged_batch(gen, MIXED, 8, 2, 64, 64, 16, torch.float32)
    sinks = _randn(gen, 8, std=2.0) if with_sinks else None
    opts = dict(scale=1.0, softcap=softcap, window=window)  # scale 1: logits large enough that softcap bites
    out, lse = ref.paged_attention(query, kc, vc, meta, sinks=sinks, return_lse=True, **opts)
    exp = _expected_batch(query, keys, values, _starts([n for n, _ in MIXED]), sinks=sinks, **opts)
    _check(out, lse, *exp, torch.float32)


def test_paged_sinks_shrink_the_output():
    """A sink only adds to the denominator: out_with = out_without * sum/(sum + e^sink)."""
    query, kc, vc, meta, _, _ = _paged_batch(_gen(4), [(3, 10)], 4, 4, 64, 64, 16, torch.float64)
    sinks = torch.tensor([-1e9, 0.0, 1.0, 3.0], dtype=torch.float64)
    plain, lse = ref.paged_attention(query, kc, vc, meta, scale=0.125, return_lse=True)
    sunk, lse_s = ref.paged_attention(query, kc, vc, meta, scale=0.125, sinks=sinks, return_lse=True)
    factor = torch.exp(lse.double()) / (torch.exp(lse.double()) + torch.exp(sinks))
    torch.testing.assert_close(sunk, plain * factor[..., None], atol=1e-6, rtol=1e-6)
    assert torch.equal(lse, lse_s)  # sinks excluded from lse


#: gpt-oss: 64 query heads, 8 KV heads, head dim 64; sliding layers keep W = 128 keys, the token's own included.
GPT_OSS_HEADS, GPT_OSS_SLIDING_WINDOW = (64, 8, 64), 128


def _hf_gpt_oss_rows(query, k, v, sinks, scale, n, window: int | None):
    """transformers' gpt-oss eager attention (sinks) under its own mask functions, on one sequence
    whose last n positions are the query rows: [n, Hq, D] in float64."""
    from types import SimpleNamespace

    from transformers.masking_utils import causal_mask_function, sliding_window_causal_mask_function
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    length, hq, hkv = k.shape[0], query.shape[1], k.shape[1]
    visible = causal_mask_function if window is None else sliding_window_causal_mask_function(window)
    keep = visible(0, 0, torch.arange(length - n, length)[:, None], torch.arange(length)[None, :]).expand(n, length)
    mask = torch.zeros(n, length, dtype=torch.float64).masked_fill(~keep, NEG_INF)[None, None]
    module = SimpleNamespace(num_key_value_groups=hq // hkv, sinks=sinks.double(), training=False)
    out, _ = eager_attention_forward(
        module,
        query.double().transpose(0, 1)[None],
        k.double().transpose(0, 1)[None],
        v.double().transpose(0, 1)[None],
        mask,
        scale,
    )
    return out[0]


@pytest.mark.parametrize("window", [GPT_OSS_SLIDING_WINDOW, None], ids=["sliding128", "full"])
def test_paged_gpt_oss_layers_are_hf(window):
    """gpt-oss's alternating layers: HF ``sliding_window`` W is ``window=(W - 1, -1)`` (the pinned
    convention), sinks join the softmax with any window. Contexts past the window: decode at W - 1,
    W and W + 1 keys (the boundary), a chunked prefill crossing it, a long decode."""
    hq, hkv, d = GPT_OSS_HEADS
    seqs = [(1, 127), (1, 128), (1, 129), (40, 200), (1, 300)]
    gen = _gen(31)
    query, kc, vc, meta, keys, values = _paged_batch(gen, seqs, hq, hkv, d, d, 16, torch.float64)
    sinks = _randn(gen, hq, std=2.0).float()
    opts = dict(scale=d**-0.5, sinks=sinks, window=(-1, -1) if window is None else (window - 1, -1))
    out = ref.paged_attention(query, kc, vc, meta, **opts)
    starts = _starts([n for n, _ in seqs])
    for b, (n, _) in enumerate(seqs):
        want = _hf_gpt_oss_rows(query[starts[b] : starts[b + 1]], keys[b], values[b], sinks, d**-0.5, n, window)
        torch.testing.assert_close(out[starts[b] : starts[b + 1]], want, atol=1e-12, rtol=1e-12)
    if window is not None:  # one key more or less changes the boundary rows
        for off in (-1, 1):
            moved = ref.paged_attention(query, kc, vc, meta, **{**opts, "window": (window - 1 + off, -1)})
            assert not torch.allclose(moved[1:3], out[1:3])


def test_paged_bf16_against_float64():
    query, kc, vc, meta, keys, values = _paged_batch(_gen(5), MIXED, 8, 2, 128, 128, 16, torch.bfloat16)
    out, lse = ref.paged_attention(query, kc, vc, meta, scale=128**-0.5, return_lse=True)
    assert out.dtype == torch.bfloat16
    exp_out, exp_lse = _expected_batch(query, keys, values, _starts([n for n, _ in MIXED]), scale=128**-0.5)
    torch.testing.assert_close(out.double(), exp_out, **TOL[torch.bfloat16])
    torch.testing.assert_close(lse.double(), exp_lse, atol=1e-4, rtol=1e-5)


def test_paged_odd_block_size_and_dv():
    seqs = [(2, 9), (3, 3), (1, 14)]
    query, kc, vc, meta, keys, values = _paged_batch(_gen(6), seqs, 4, 2, 64, 32, 5, torch.float64)
    out, lse = ref.paged_attention(query, kc, vc, meta, scale=0.2, return_lse=True)
    _check(out, lse, *_expected_batch(query, keys, values, _starts([2, 3, 1]), scale=0.2), torch.float64)


@pytest.mark.parametrize("seqs", [[(0, 5), (0, 3)], []], ids=["idle-seqs", "no-seqs"])
def test_paged_no_tokens(seqs):
    query, kc, vc, meta, _, _ = _paged_batch(_gen(7), seqs, 4, 2, 64, 64, 16, torch.float32)
    out, lse = ref.paged_attention(query, kc, vc, meta, scale=0.1, return_lse=True)
    assert out.shape == (0, 4, 64) and lse.shape == (0, 4) and lse.dtype == torch.float32


def test_paged_out_argument_and_inputs_unchanged():
    gen = _gen(8)
    query, kc, vc, meta, _, _ = _paged_batch(gen, MIXED, 8, 2, 64, 64, 16, torch.float32)
    sinks = _randn(gen, 8)
    before = [t.clone() for t in (query, kc, vc, sinks, meta.block_table, meta.seq_lens, meta.query_start_loc)]
    plain = ref.paged_attention(query, kc, vc, meta, scale=0.125, sinks=sinks)
    out = torch.full((8, query.shape[0], 64), float("nan")).transpose(0, 1)  # non-contiguous, poisoned
    got = ref.paged_attention(query, kc, vc, meta, scale=0.125, sinks=sinks, out=out)
    assert got is out and torch.equal(out, plain)
    for a, b in zip(before, (query, kc, vc, sinks, meta.block_table, meta.seq_lens, meta.query_start_loc)):
        assert torch.equal(a, b)


def test_paged_non_contiguous_inputs():
    query, kc, vc, meta, keys, values = _paged_batch(_gen(9), MIXED, 8, 2, 64, 64, 16, torch.float32)
    wide_k = torch.cat([kc, kc.flip(-1)], dim=-1)[..., :64]  # strided views with the same values
    q_t = query.transpose(0, 1).contiguous().transpose(0, 1)
    vc_t = vc.transpose(1, 2).contiguous().transpose(1, 2)
    assert not (wide_k.is_contiguous() or q_t.is_contiguous() or vc_t.is_contiguous())
    out = ref.paged_attention(q_t, wide_k, vc_t, meta, scale=0.125)
    torch.testing.assert_close(out, ref.paged_attention(query, kc, vc, meta, scale=0.125), atol=1e-6, rtol=1e-6)


# ----------------------------------------------------------------------------- varlen attention


def _varlen_batch(gen, seqs, hq, hkv, d, dv, dtype):
    query = _randn(gen, sum(n for n, _ in seqs), hq, d, dtype=dtype)
    keys = [_randn(gen, lk, hkv, d, dtype=dtype) for _, lk in seqs]
    values = [_randn(gen, lk, hkv, dv, dtype=dtype) for _, lk in seqs]
    cq, ck = _starts([n for n, _ in seqs]), _starts([lk for _, lk in seqs])
    key = torch.cat(keys) if keys else _randn(gen, 0, hkv, d, dtype=dtype)
    value = torch.cat(values) if values else _randn(gen, 0, hkv, dv, dtype=dtype)
    args = (query, key, value, torch.tensor(cq, dtype=torch.int32), torch.tensor(ck, dtype=torch.int32))
    return args + (max((n for n, _ in seqs), default=0), max((lk for _, lk in seqs), default=0)), keys, values, cq


#: ordinary, decode-like, more queries than keys (first rows see nothing under causal), no keys, no queries.
VARLEN = [(5, 9), (1, 1), (6, 3), (3, 0), (0, 5), (4, 4)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "causal,window,softcap",
    [(True, (-1, -1), 0.0), (True, (2, -1), 0.0), (False, (1, 1), 0.0), (False, (-1, -1), 0.0), (True, (-1, -1), 10.0)],
)
def test_varlen_matches_reference(causal, window, softcap, dtype):
    args, keys, values, cq = _varlen_batch(_gen(10), VARLEN, 8, 2, 192, 128, dtype)  # MLA prefill dims
    opts = dict(scale=192**-0.5, causal=causal, window=window, softcap=softcap)
    out, lse = ref.varlen_attention(*args, return_lse=True, **opts)
    assert out.shape == (args[0].shape[0], 8, 128) and out.dtype == dtype
    _check(out, lse, *_expected_batch(args[0], keys, values, cq, **opts), dtype)


def test_varlen_empty_rows_are_zero_and_neg_inf():
    args, _, _, cq = _varlen_batch(_gen(11), VARLEN, 4, 4, 64, 64, torch.float32)
    out, lse = ref.varlen_attention(*args, scale=0.125, return_lse=True)
    rows = list(range(cq[2], cq[2] + 3)) + list(range(cq[3], cq[4]))  # (6,3): first 3 rows; (3,0): all
    assert torch.equal(out[rows], torch.zeros_like(out[rows]))
    assert torch.isneginf(lse[rows]).all() and torch.isfinite(lse[[r for r in range(len(lse)) if r not in rows]]).all()


def test_varlen_bf16_and_no_tokens():
    args, keys, values, cq = _varlen_batch(_gen(12), [(4, 7), (2, 2)], 8, 1, 64, 64, torch.bfloat16)
    out = ref.varlen_attention(*args, scale=0.125)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(
        out.double(), _expected_batch(args[0], keys, values, cq, scale=0.125)[0], **TOL[torch.bfloat16]
    )
    args, _, _, _ = _varlen_batch(_gen(12), [], 8, 1, 64, 32, torch.float32)
    out, lse = ref.varlen_attention(*args, scale=0.125, return_lse=True)
    assert out.shape == (0, 8, 32) and lse.shape == (0, 8)


def test_varlen_inputs_unchanged():
    args, _, _, _ = _varlen_batch(_gen(13), VARLEN, 4, 2, 64, 64, torch.float32)
    before = [a.clone() for a in args[:5]]
    ref.varlen_attention(*args, scale=0.125, softcap=5.0)
    assert all(torch.equal(a, b) for a, b in zip(before, args[:5]))


# ----------------------------------------------------------------------------- MLA


def _mla_batch(gen, seqs, h, lkv, r, bs, dtype):
    used = [-(-length // bs) for _, length in seqs]
    nb = sum(used) + 2
    free = iter(torch.randperm(nb, generator=gen).tolist())
    ckv_cache, kpe_cache = _randn(gen, nb, bs, lkv, dtype=dtype), _randn(gen, nb, bs, r, dtype=dtype)
    ckvs, kpes, table = [], [], []
    for (_, length), m in zip(seqs, used):
        ids = [next(free) for _ in range(m)]
        table.append(ids + [0] * (max(used) - m))
        ckv, kpe = _randn(gen, length, lkv, dtype=dtype), _randn(gen, length, r, dtype=dtype)
        for j in range(length):
            ckv_cache[ids[j // bs], j % bs], kpe_cache[ids[j // bs], j % bs] = ckv[j], kpe[j]
        ckvs.append(ckv)
        kpes.append(kpe)
    meta = AttentionMeta.build([n for n, _ in seqs], [length for _, length in seqs], table)
    return ckv_cache, kpe_cache, meta, ckvs, kpes


MLA_SEQS = [(3, 3), (1, 20), (4, 13)]


@pytest.mark.parametrize("causal", [True, False])
def test_mla_absorbed_matches_unabsorbed(causal):
    gen = _gen(20)
    h, lkv, r, dnope, dv = 4, 512, 64, 128, 128
    ckv_cache, kpe_cache, meta, ckvs, kpes = _mla_batch(gen, MLA_SEQS, h, lkv, r, 8, torch.float64)
    w_uk = _randn(gen, h, lkv, dnope, dtype=torch.float64, std=lkv**-0.5)
    w_uv = _randn(gen, h, lkv, dv, dtype=torch.float64, std=lkv**-0.5)
    t = sum(n for n, _ in MLA_SEQS)
    q_nope, q_pe = _randn(gen, t, h, dnope, dtype=torch.float64), _randn(gen, t, h, r, dtype=torch.float64)
    scale = (dnope + r) ** -0.5
    # Non-absorbed: per-head keys [ckv W_UK_h, kpe] and values ckv W_UV_h.
    keys = [
        torch.cat([torch.einsum("lc,hcd->lhd", c, w_uk), p[:, None].expand(-1, h, -1)], -1) for c, p in zip(ckvs, kpes)
    ]
    values = [torch.einsum("lc,hcv->lhv", c, w_uv) for c in ckvs]
    query = torch.cat([q_nope, q_pe], -1)
    exp_out, exp_lse = _expected_batch(
        query, keys, values, _starts([n for n, _ in MLA_SEQS]), scale=scale, causal=causal
    )
    q_abs = torch.einsum("thd,hcd->thc", q_nope, w_uk)
    latent, lse = ref.mla_attention(
        q_abs, q_pe, ckv_cache, kpe_cache, meta, scale=scale, causal=causal, return_lse=True
    )
    assert latent.shape == (t, h, lkv)
    _check(torch.einsum("thc,hcv->thv", latent, w_uv), lse, exp_out, exp_lse, torch.float64)


def test_mla_bf16_against_float64_and_inputs_unchanged():
    gen = _gen(21)
    ckv_cache, kpe_cache, meta, ckvs, kpes = _mla_batch(gen, MLA_SEQS, 4, 512, 64, 16, torch.bfloat16)
    t = sum(n for n, _ in MLA_SEQS)
    q_nope, q_pe = _randn(gen, t, 4, 512, dtype=torch.bfloat16), _randn(gen, t, 4, 64, dtype=torch.bfloat16)
    before = [x.clone() for x in (q_nope, q_pe, ckv_cache, kpe_cache)]
    out = ref.mla_attention(q_nope, q_pe, ckv_cache, kpe_cache, meta, scale=576**-0.5)
    assert out.dtype == torch.bfloat16
    keys = [torch.cat([c, p], -1)[:, None] for c, p in zip(ckvs, kpes)]
    exp, _ = _expected_batch(
        torch.cat([q_nope, q_pe], -1), keys, [c[:, None] for c in ckvs], _starts([3, 1, 4]), scale=576**-0.5
    )
    torch.testing.assert_close(out.double(), exp, **TOL[torch.bfloat16])
    assert all(torch.equal(a, b) for a, b in zip(before, (q_nope, q_pe, ckv_cache, kpe_cache)))


def test_mla_no_tokens():
    ckv_cache, kpe_cache, meta, _, _ = _mla_batch(_gen(22), [(0, 4)], 4, 512, 64, 16, torch.float32)
    out, lse = ref.mla_attention(
        torch.zeros(0, 4, 512), torch.zeros(0, 4, 64), ckv_cache, kpe_cache, meta, scale=0.1, return_lse=True
    )
    assert out.shape == (0, 4, 512) and lse.shape == (0, 4)


# ----------------------------------------------------------------------------- cache writes


def _expected_write(cache, src, slots):
    exp = cache.clone()
    bs = cache.shape[1]
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            exp[s // bs, s % bs] = src[t]
    return exp


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_kv(dtype):
    gen = _gen(30)
    nb, bs, hkv, d, dv, t = 6, 4, 2, 64, 32, 9
    k_cache, v_cache = _randn(gen, nb, bs, hkv, d, dtype=dtype), _randn(gen, nb, bs, hkv, dv, dtype=dtype)
    key, value = _randn(gen, t, hkv, d, dtype=dtype), _randn(gen, t, hkv, dv, dtype=dtype)
    slots = torch.randperm(nb * bs, generator=gen)[:t]
    slots[[1, 4, 8]] = -1
    exp_k, exp_v = _expected_write(k_cache, key, slots), _expected_write(v_cache, value, slots)
    before = [x.clone() for x in (key, value, slots)]
    assert ref.write_kv(key, value, k_cache, v_cache, slots) is None
    assert torch.equal(k_cache, exp_k) and torch.equal(v_cache, exp_v)
    assert all(torch.equal(a, b) for a, b in zip(before, (key, value, slots)))
    ref.write_kv(key[:0], value[:0], k_cache, v_cache, slots[:0])  # no tokens: a no-op
    assert torch.equal(k_cache, exp_k)
    strided = torch.cat([k_cache, k_cache], dim=-1)[..., d:]  # a non-contiguous cache view
    exp_s = _expected_write(strided, key.flip(0), slots)
    ref.write_kv(key.flip(0), value, strided, v_cache, slots)
    assert torch.equal(strided, exp_s)


def test_write_mla_kv():
    gen = _gen(31)
    nb, bs, lkv, r, t = 5, 8, 512, 64, 7
    ckv_cache, kpe_cache = _randn(gen, nb, bs, lkv), _randn(gen, nb, bs, r)
    kv_c, k_pe = _randn(gen, t, lkv), _randn(gen, t, r)
    slots = torch.randperm(nb * bs, generator=gen)[:t]
    slots[0] = -1
    exp_c, exp_p = _expected_write(ckv_cache, kv_c, slots), _expected_write(kpe_cache, k_pe, slots)
    ref.write_mla_kv(kv_c, k_pe, ckv_cache, kpe_cache, slots)
    assert torch.equal(ckv_cache, exp_c) and torch.equal(kpe_cache, exp_p)


def test_write_kv_then_paged_attention_round_trip():
    """Writing a sequence through write_kv then attending over it equals attending over the dense KV."""
    gen = _gen(32)
    query, kc, vc, meta, keys, values = _paged_batch(gen, [(3, 11)], 4, 2, 64, 64, 4, torch.float32)
    blocks = meta.block_table[0].tolist()
    slots = torch.tensor([blocks[j // 4] * 4 + j % 4 for j in range(11)], dtype=torch.int64)
    kc2, vc2 = _randn(gen, *kc.shape), _randn(gen, *vc.shape)
    ref.write_kv(keys[0], values[0], kc2, vc2, slots)
    torch.testing.assert_close(
        ref.paged_attention(query, kc2, vc2, meta, scale=0.1), ref.paged_attention(query, kc, vc, meta, scale=0.1)
    )


# ----------------------------------------------------------------------------- merge


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_merge_matches_attention_over_all_keys(dtype):
    gen = _gen(40)
    seqs = [(4, 20), (3, 5), (2, 9)]
    (query, key, value, _, ck, mq, mk), _, _, _ = _varlen_batch(gen, seqs, 8, 2, 64, 64, dtype)
    cq = torch.tensor(_starts([n for n, _ in seqs]), dtype=torch.int32)
    full, full_lse = ref.varlen_attention(query, key, value, cq, ck, mq, mk, scale=0.125, causal=False, return_lse=True)
    # Disjoint split per sequence; sequence 1 puts all its keys on side a (side b empty: lse -inf).
    parts = {"a": [], "b": []}
    for b, (_, lk) in enumerate(seqs):
        perm = torch.randperm(lk, generator=gen) + int(ck[b])
        cut = lk if b == 1 else lk // 3
        parts["a"].append(perm[:cut])
        parts["b"].append(perm[cut:])
    halves = []
    for side in ("a", "b"):
        idx = torch.cat(parts[side])
        cks = torch.tensor(_starts([len(p) for p in parts[side]]), dtype=torch.int32)
        halves += list(
            ref.varlen_attention(
                query, key[idx], value[idx], cq, cks, mq, mk, scale=0.125, causal=False, return_lse=True
            )
        )
    assert torch.isneginf(halves[3][4:7]).all()
    out, lse = ref.merge_attention(*halves)
    assert out.dtype == dtype and lse.dtype == torch.float32
    torch.testing.assert_close(out, full, **({"atol": 1e-6, "rtol": 1e-6} if dtype == torch.float64 else TOL[dtype]))
    torch.testing.assert_close(lse, full_lse, **LSE_TOL)


def test_merge_empty_sides():
    gen = _gen(41)
    out_a, out_b = _randn(gen, 3, 2, 16), _randn(gen, 3, 2, 16)  # garbage where lse is -inf
    lse_a = torch.tensor([[NEG_INF, 0.5], [NEG_INF, 1.0], [0.3, -2.0]])
    lse_b = torch.tensor([[NEG_INF, NEG_INF], [0.2, NEG_INF], [NEG_INF, 0.7]])
    out_a[0, 0], out_a[1, 0], out_b[0, 1] = float("nan"), float("inf"), float("nan")  # an empty side adds nothing
    out, lse = ref.merge_attention(out_a, lse_a, out_b, lse_b)
    assert torch.isfinite(out).all() and not torch.isnan(lse).any()
    assert torch.equal(out[0, 0], torch.zeros(16)) and lse[0, 0] == NEG_INF
    torch.testing.assert_close(out[0, 1], out_a[0, 1])
    torch.testing.assert_close(out[1, 0], out_b[1, 0])
    torch.testing.assert_close(out[2, 0], out_a[2, 0])
    torch.testing.assert_close(lse, torch.logaddexp(lse_a, lse_b))
    w = torch.exp(lse_a[2, 1] - lse[2, 1]), torch.exp(lse_b[2, 1] - lse[2, 1])
    torch.testing.assert_close(out[2, 1], w[0] * out_a[2, 1] + w[1] * out_b[2, 1])


def test_merge_bf16_keeps_dtype():
    gen = _gen(42)
    out_a, out_b = _randn(gen, 4, 2, 8, dtype=torch.bfloat16), _randn(gen, 4, 2, 8, dtype=torch.bfloat16)
    lse_a, lse_b = _randn(gen, 4, 2), _randn(gen, 4, 2)
    out, lse = ref.merge_attention(out_a, lse_a, out_b, lse_b)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    exp = (
        torch.sigmoid(lse_a - lse_b)[..., None].double() * out_a.double()
        + torch.sigmoid(lse_b - lse_a)[..., None].double() * out_b.double()
    )
    torch.testing.assert_close(out.double(), exp, **TOL[torch.bfloat16])


# ----------------------------------------------------------------------------- bad inputs


def _paged_args():
    query, kc, vc, meta, _, _ = _paged_batch(_gen(50), [(2, 5), (1, 3)], 4, 2, 8, 8, 4, torch.float32)
    return dict(query=query, k_cache=kc, v_cache=vc, meta=meta, scale=0.3)


def _meta(a, **fields):
    return {
        **a,
        "meta": dataclasses.replace(a["meta"], **{k: torch.tensor(v, dtype=torch.int32) for k, v in fields.items()}),
    }


ON_META = torch.device("meta")  # a device other than the CPU, available everywhere

PAGED_BAD = {
    "query-rank": ("query", lambda a: {**a, "query": a["query"][0]}),
    "query-int": ("query", lambda a: {**a, "query": a["query"].to(torch.int32)}),
    "cache-dtype": ("k_cache", lambda a: {**a, "k_cache": a["k_cache"].double()}),
    "cache-head-dim": ("k_cache", lambda a: {**a, "k_cache": a["k_cache"][..., :4]}),
    "v-cache-blocks": ("v_cache", lambda a: {**a, "v_cache": a["v_cache"][:-1]}),
    "v-cache-rank": ("v_cache", lambda a: {**a, "v_cache": a["v_cache"][0]}),
    "gqa-ratio": ("k_cache", lambda a: {**a, "query": a["query"][:, :3]}),
    "block-id-too-big": ("meta.block_table", lambda a: _meta(a, block_table=[[0, 99], [1, 0]])),
    "block-id-negative": ("meta.block_table", lambda a: _meta(a, block_table=[[0, -1], [1, 0]])),
    "block-table-narrow": ("meta.block_table", lambda a: _meta(a, block_table=[[0], [1]])),
    "qsl-decreasing": ("meta.query_start_loc", lambda a: _meta(a, query_start_loc=[0, 4, 3])),
    "qsl-end": ("meta.query_start_loc", lambda a: _meta(a, query_start_loc=[0, 2, 2])),
    "qsl-start": ("meta.query_start_loc", lambda a: _meta(a, query_start_loc=[1, 2, 3])),
    "seq-lens-short": ("meta.seq_lens", lambda a: _meta(a, seq_lens=[1, 3])),
    "meta-type": ("meta", lambda a: {**a, "meta": {"seq_lens": a["meta"].seq_lens}}),
    "sinks-shape": ("sinks", lambda a: {**a, "sinks": torch.ones(5)}),
    "sinks-dtype": ("sinks", lambda a: {**a, "sinks": torch.ones(4, dtype=torch.float16)}),
    "sinks-device": ("sinks", lambda a: {**a, "sinks": torch.ones(4, device=ON_META)}),
    "scale-nan": ("scale", lambda a: {**a, "scale": float("nan")}),
    "scale-inf": ("scale", lambda a: {**a, "scale": float("inf")}),
    "scale-str": ("scale", lambda a: {**a, "scale": "0.3"}),
    "scale-none": ("scale", lambda a: {**a, "scale": None}),
    "scale-tensor": ("scale", lambda a: {**a, "scale": torch.tensor(0.3)}),
    "scale-bool": ("scale", lambda a: {**a, "scale": True}),
    "window-len": ("window", lambda a: {**a, "window": (4,)}),
    "window-float": ("window", lambda a: {**a, "window": (4.0, -1)}),
    "window-int": ("window", lambda a: {**a, "window": 4}),
    "window-below-minus-one": ("window", lambda a: {**a, "window": (-2, -1)}),
    "softcap-negative": ("softcap", lambda a: {**a, "softcap": -1.0}),
    "causal-not-bool": ("causal", lambda a: {**a, "causal": "yes"}),
    "return-lse-not-bool": ("return_lse", lambda a: {**a, "return_lse": 1}),
    "out-shape": ("out", lambda a: {**a, "out": torch.empty(3, 4, 7)}),
    "out-dtype": ("out", lambda a: {**a, "out": torch.empty(3, 4, 8, dtype=torch.float64)}),
    "out-device": ("out", lambda a: {**a, "out": torch.empty(3, 4, 8, device=ON_META)}),
    "cache-device": ("k_cache", lambda a: {**a, "k_cache": a["k_cache"].to(ON_META)}),
    "meta-device": (
        "meta.block_table",
        lambda a: {**a, "meta": dataclasses.replace(a["meta"], block_table=a["meta"].block_table.to(ON_META))},
    ),
}


@pytest.mark.parametrize("case", list(PAGED_BAD))
def test_paged_bad_input(case):
    arg, mutate = PAGED_BAD[case]
    with pytest.raises(OpError, match=rf"^paged_attention: argument '{arg}': expected "):
        ref.paged_attention(**mutate(_paged_args()))


def _varlen_args():
    args, _, _, _ = _varlen_batch(_gen(51), [(2, 3), (1, 4)], 4, 2, 8, 8, torch.float32)
    names = ("query", "key", "value", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")
    return {**dict(zip(names, args)), "scale": 0.3}


def _i32(v):
    return torch.tensor(v, dtype=torch.int32)


VARLEN_BAD = {
    "query-rank": ("query", lambda a: {**a, "query": a["query"].flatten(1)}),
    "key-head-dim": ("key", lambda a: {**a, "key": a["key"][..., :4]}),
    "key-dtype": ("key", lambda a: {**a, "key": a["key"].half()}),
    "value-tokens": ("value", lambda a: {**a, "value": a["value"][:-1]}),
    "gqa-ratio": ("key", lambda a: {**a, "query": a["query"][:, :3]}),
    "cu-q-decreasing": ("cu_seqlens_q", lambda a: {**a, "cu_seqlens_q": _i32([0, 4, 3])}),
    "cu-q-end": ("cu_seqlens_q", lambda a: {**a, "cu_seqlens_q": _i32([0, 1, 2])}),
    "cu-q-float": ("cu_seqlens_q", lambda a: {**a, "cu_seqlens_q": a["cu_seqlens_q"].float()}),
    "cu-k-end": ("cu_seqlens_k", lambda a: {**a, "cu_seqlens_k": _i32([0, 3, 8])}),
    "cu-k-batch": ("cu_seqlens_k", lambda a: {**a, "cu_seqlens_k": _i32([0, 7])}),
    "cu-k-device": ("cu_seqlens_k", lambda a: {**a, "cu_seqlens_k": a["cu_seqlens_k"].to(ON_META)}),
    "max-q-small": ("max_seqlen_q", lambda a: {**a, "max_seqlen_q": 1}),
    "max-k-type": ("max_seqlen_k", lambda a: {**a, "max_seqlen_k": 4.0}),
    "scale-nan": ("scale", lambda a: {**a, "scale": float("nan")}),
    "window-str": ("window", lambda a: {**a, "window": "ab"}),
    "softcap-inf": ("softcap", lambda a: {**a, "softcap": float("inf")}),
}


@pytest.mark.parametrize("case", list(VARLEN_BAD))
def test_varlen_bad_input(case):
    arg, mutate = VARLEN_BAD[case]
    with pytest.raises(OpError, match=rf"^varlen_attention: argument '{arg}': expected "):
        ref.varlen_attention(**mutate(_varlen_args()))


def _write_args():
    gen = _gen(52)
    return dict(
        key=_randn(gen, 3, 2, 8),
        value=_randn(gen, 3, 2, 6),
        k_cache=_randn(gen, 4, 2, 2, 8),
        v_cache=_randn(gen, 4, 2, 2, 6),
        slot_mapping=torch.tensor([0, -1, 5]),
    )


WRITE_BAD = {
    "slot-too-big": ("slot_mapping", lambda a: {**a, "slot_mapping": torch.tensor([0, 8, 1])}),
    "slot-below-minus-one": ("slot_mapping", lambda a: {**a, "slot_mapping": torch.tensor([0, -2, 1])}),
    "slot-int32": ("slot_mapping", lambda a: {**a, "slot_mapping": a["slot_mapping"].int()}),
    "slot-length": ("slot_mapping", lambda a: {**a, "slot_mapping": torch.tensor([0, 1])}),
    "key-rank": ("key", lambda a: {**a, "key": a["key"][0]}),
    "value-tokens": ("value", lambda a: {**a, "value": a["value"][:2]}),
    "value-dtype": ("value", lambda a: {**a, "value": a["value"].double()}),
    "cache-dtype": ("k_cache", lambda a: {**a, "k_cache": a["k_cache"].half()}),
    "cache-heads": ("k_cache", lambda a: {**a, "k_cache": a["k_cache"][:, :, :1]}),
    "v-cache-dim": ("v_cache", lambda a: {**a, "v_cache": a["v_cache"][..., :5]}),
    "v-cache-blocks": ("v_cache", lambda a: {**a, "v_cache": a["v_cache"][:3]}),
    "cache-device": ("v_cache", lambda a: {**a, "v_cache": a["v_cache"].to(ON_META)}),
}


@pytest.mark.parametrize("case", list(WRITE_BAD))
def test_write_kv_bad_input_raises_and_writes_nothing(case):
    arg, mutate = WRITE_BAD[case]
    args = mutate(_write_args())
    before = [args[n].clone() for n in ("k_cache", "v_cache") if args[n].device.type == "cpu"]
    with pytest.raises(OpError, match=rf"^write_kv: argument '{arg}': expected "):
        ref.write_kv(**args)
    after = [args[n] for n in ("k_cache", "v_cache") if args[n].device.type == "cpu"]
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def _mla_args():
    gen = _gen(53)
    ckv_cache, kpe_cache, meta, _, _ = _mla_batch(gen, [(2, 5), (1, 3)], 2, 16, 4, 4, torch.float32)
    return dict(
        q_nope=_randn(gen, 3, 2, 16),
        q_pe=_randn(gen, 3, 2, 4),
        ckv_cache=ckv_cache,
        kpe_cache=kpe_cache,
        meta=meta,
        scale=0.2,
    )


MLA_BAD = {
    "q-nope-rank": ("q_nope", lambda a: {**a, "q_nope": a["q_nope"][0]}),
    "q-pe-tokens": ("q_pe", lambda a: {**a, "q_pe": a["q_pe"][:2]}),
    "q-pe-heads": ("q_pe", lambda a: {**a, "q_pe": a["q_pe"][:, :1]}),
    "ckv-dim": ("ckv_cache", lambda a: {**a, "ckv_cache": a["ckv_cache"][..., :8]}),
    "ckv-dtype": ("ckv_cache", lambda a: {**a, "ckv_cache": a["ckv_cache"].double()}),
    "kpe-dim": ("kpe_cache", lambda a: {**a, "kpe_cache": a["kpe_cache"][..., :3]}),
    "kpe-blocks": ("kpe_cache", lambda a: {**a, "kpe_cache": a["kpe_cache"][:1]}),
    "block-id-too-big": ("meta.block_table", lambda a: _meta(a, block_table=[[0, 50], [1, 0]])),
    "seq-lens-short": ("meta.seq_lens", lambda a: _meta(a, seq_lens=[5, 0])),
    "qsl-end": ("meta.query_start_loc", lambda a: _meta(a, query_start_loc=[0, 2, 4])),
    "scale-inf": ("scale", lambda a: {**a, "scale": float("-inf")}),
    "causal-not-bool": ("causal", lambda a: {**a, "causal": None}),
    "cache-device": ("kpe_cache", lambda a: {**a, "kpe_cache": a["kpe_cache"].to(ON_META)}),
}


@pytest.mark.parametrize("case", list(MLA_BAD))
def test_mla_bad_input(case):
    arg, mutate = MLA_BAD[case]
    with pytest.raises(OpError, match=rf"^mla_attention: argument '{arg}': expected "):
        ref.mla_attention(**mutate(_mla_args()))


def test_write_mla_kv_bad_input():
    gen = _gen(54)
    good = dict(
        kv_c=_randn(gen, 2, 16),
        k_pe=_randn(gen, 2, 4),
        ckv_cache=_randn(gen, 3, 4, 16),
        kpe_cache=_randn(gen, 3, 4, 4),
        slot_mapping=torch.tensor([3, -1]),
    )
    bad = {
        "kv_c": {"kv_c": good["kv_c"][None]},
        "k_pe": {"k_pe": good["k_pe"][:1]},
        "ckv_cache": {"ckv_cache": good["ckv_cache"][..., :8]},
        "kpe_cache": {"kpe_cache": good["kpe_cache"].double()},
        "slot_mapping": {"slot_mapping": torch.tensor([3, 12])},
    }
    for arg, change in bad.items():
        with pytest.raises(OpError, match=rf"^write_mla_kv: argument '{arg}': expected "):
            ref.write_mla_kv(**{**good, **change})


def _merge_args():
    gen = _gen(55)
    return dict(
        out_a=_randn(gen, 3, 2, 8), lse_a=_randn(gen, 3, 2), out_b=_randn(gen, 3, 2, 8), lse_b=_randn(gen, 3, 2)
    )


MERGE_BAD = {
    "out-a-rank": ("out_a", lambda a: {**a, "out_a": a["out_a"][0]}),
    "out-b-shape": ("out_b", lambda a: {**a, "out_b": a["out_b"][:, :, :4]}),
    "out-b-dtype": ("out_b", lambda a: {**a, "out_b": a["out_b"].half()}),
    "lse-a-dtype": ("lse_a", lambda a: {**a, "lse_a": a["lse_a"].half()}),
    "lse-b-shape": ("lse_b", lambda a: {**a, "lse_b": a["lse_b"][:2]}),
    "lse-b-device": ("lse_b", lambda a: {**a, "lse_b": a["lse_b"].to(ON_META)}),
}


@pytest.mark.parametrize("case", list(MERGE_BAD))
def test_merge_bad_input(case):
    arg, mutate = MERGE_BAD[case]
    with pytest.raises(OpError, match=rf"^merge_attention: argument '{arg}': expected "):
        ref.merge_attention(**mutate(_merge_args()))


def test_error_message_says_what_came():
    args = _paged_args()
    with pytest.raises(OpError) as info:
        ref.paged_attention(**_meta(args, block_table=[[0, 99], [1, 0]]))
    assert "[0, " in str(info.value) and "99" in str(info.value)
    assert info.value.op == "paged_attention" and info.value.arg == "meta.block_table"
