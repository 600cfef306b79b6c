"""The Triton attention kernels (paged, varlen, MLA) under the interpreter, against the reference.

Shapes are tiny (the interpreter runs each program in Python) but cover what the kernel
branches on: GQA groups that are not powers of two, head dims padded to powers of two,
block sizes that do not divide the lengths, several query tiles per sequence and several
key tiles per row (two tunings), causal/window/softcap/sinks masks, empty rows, ``out=``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hetero.errors import OpError
from hetero.kernels.tuning import Tuning, TuningTable
from hetero.spec import AttentionMeta
from hetero_cpu_ref import attention as ref

TILES = {
    "paged_attention": {"BLOCK_M": 16, "BLOCK_N": 16},
    "varlen_attention": {"BLOCK_M": 16, "BLOCK_N": 16},
    "mla_attention": {"BLOCK_M": 16, "BLOCK_N": 16},
}


def tuning(kind: str) -> Tuning:
    """ "small": 16x16 tiles (many query and key tiles per sequence); "wide": 32 rows x 64 keys."""
    wide = {k: {"BLOCK_M": 32, "BLOCK_N": 64} for k in TILES}
    table = TuningTable(vendor="test", archs={"small": TILES, "wide": wide})
    return Tuning(table, kind, interpreted=True)  # an arch other than "interpreter": the table's tiles apply


@pytest.fixture
def attn():
    from hetero.kernels import attention  # imports Triton: after the fixture switched the interpreter on

    return attention


def paged_inputs(seqs, hq, hkv, d, dv, bs, dtype=torch.float32, seed=0):
    """query, caches with randomly permuted blocks (more than used) and the metadata."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-L // bs) for _, L in seqs]
    nb = sum(need) + 3
    ids = torch.randperm(nb, generator=g).tolist()
    table, at = [], 0
    for k in need:
        table.append(ids[at : at + k] + [ids[-1]] * (max(need) + 1 - k))
        at += k
    t = sum(n for n, _ in seqs)
    q = torch.randn(t, hq, d, generator=g).to(dtype)
    kc = torch.randn(nb, bs, hkv, d, generator=g).to(dtype)
    vc = torch.randn(nb, bs, hkv, dv, generator=g).to(dtype)
    meta = AttentionMeta.build([n for n, _ in seqs], [L for _, L in seqs], table)
    return q, kc, vc, meta


def close(got, want, atol=2e-5, rtol=1e-5):
    assert torch.isfinite(got).eq(torch.isfinite(want)).all(), "NaN/Inf pattern differs"
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=rtol, equal_nan=False)


@pytest.mark.parametrize("tiles", ["small", "wide"])
def test_paged_gqa_mixed_batch(attn, tiles):
    """Prefill, decode and chunked prefill in one batch; group 3 (not a power of two), D=48
    (padded to 64), block size 5; lse included."""
    seqs = [(9, 9), (1, 40), (7, 23)]
    q, kc, vc, meta = paged_inputs(seqs, hq=6, hkv=2, d=48, dv=48, bs=5)
    out, lse = attn.paged_attention(q, kc, vc, meta, scale=0.15, return_lse=True, tuning=tuning(tiles))
    want, want_lse = ref.paged_attention(q, kc, vc, meta, scale=0.15, return_lse=True)
    close(out, want)
    close(lse, want_lse)
    assert out.dtype == q.dtype and lse.dtype == torch.float32


@pytest.mark.parametrize("window", [(127, -1), (-1, -1)], ids=["sliding128", "full"])
def test_paged_gpt_oss_layers(attn, window):
    """gpt-oss's alternating layers (GQA 64:8, D 64, sinks; HF sliding_window 128 = window (127, -1)),
    contexts past the window: decode at 128 and 129 keys (the boundary), a chunked prefill across it,
    and rows of one to three keys that the sinks dominate. Heads cut to 16:2 for the interpreter."""
    seqs = [(1, 128), (1, 129), (20, 150), (3, 3)]
    q, kc, vc, meta = paged_inputs(seqs, hq=16, hkv=2, d=64, dv=64, bs=16, seed=7)
    sinks = torch.linspace(-1.0, 9.0, 16)
    opts = dict(scale=64**-0.5, window=window, sinks=sinks, return_lse=True)
    out, lse = attn.paged_attention(q, kc, vc, meta, tuning=tuning("wide"), **opts)
    want, want_lse = ref.paged_attention(q, kc, vc, meta, **opts)
    close(out, want)
    close(lse, want_lse)


def test_paged_window_softcap_sinks_out(attn):
    """Sliding window, softcap and sinks together, written into a given out= buffer."""
    seqs = [(12, 30), (1, 33), (4, 4)]
    q, kc, vc, meta = paged_inputs(seqs, hq=4, hkv=1, d=32, dv=16, bs=8, seed=1)
    q = q * 8  # logits large enough for the softcap to bend them
    sinks = torch.linspace(-1.0, 4.0, 4)
    opts = dict(scale=0.2, window=(10, -1), softcap=5.0, sinks=sinks, return_lse=True)
    buf = torch.full((q.shape[0], 4, 16), float("nan"))
    out, lse = attn.paged_attention(q, kc, vc, meta, out=buf, tuning=tuning("small"), **opts)
    want, want_lse = ref.paged_attention(q, kc, vc, meta, **opts)
    assert out is buf
    close(out, want)
    close(lse, want_lse)


def test_paged_bfloat16_strided_table(attn):
    """bf16 operands (upcast to float32 for the interpreter's dot), output in bf16; the block
    table a column-strided view."""
    seqs = [(5, 21), (1, 9)]
    q, kc, vc, meta = paged_inputs(seqs, hq=4, hkv=2, d=32, dv=32, bs=4, dtype=torch.bfloat16, seed=2)
    wide = torch.stack([meta.block_table, torch.full_like(meta.block_table, 10**6)], dim=2).flatten(1)
    meta = dataclasses.replace(meta, block_table=wide[:, ::2])
    out = attn.paged_attention(q, kc, vc, meta, scale=0.18, tuning=tuning("small"))
    want = ref.paged_attention(q.double(), kc.double(), vc.double(), meta, scale=0.18)
    assert out.dtype == torch.bfloat16
    close(out, want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("causal", [True, False])
def test_varlen_mla_prefill_dims(attn, causal):
    """D=192 and Dv=128 (MLA prefill, padded to 256 and 128), a sequence with fewer keys than
    queries (its first rows see nothing when causal: out 0, lse -inf) and a window."""
    g = torch.Generator().manual_seed(3)
    qs, ks = [6, 3, 5], [6, 10, 2]
    cu_q = torch.tensor([0, 6, 9, 14], dtype=torch.int32)
    cu_k = torch.tensor([0, 6, 16, 18], dtype=torch.int32)
    q = torch.randn(sum(qs), 2, 192, generator=g)
    k = torch.randn(sum(ks), 1, 192, generator=g)
    v = torch.randn(sum(ks), 1, 128, generator=g)
    opts = dict(scale=192**-0.5, causal=causal, window=(4, 2) if not causal else (-1, -1), return_lse=True)
    out, lse = attn.varlen_attention(q, k, v, cu_q, cu_k, 6, 10, tuning=tuning("small"), **opts)
    want, want_lse = ref.varlen_attention(q, k, v, cu_q, cu_k, 6, 10, **opts)
    close(out, want)
    close(lse, want_lse)
    if causal:  # sequence 2: 5 queries over 2 keys, rows 0..2 at positions < 0
        assert torch.isneginf(lse[9:12]).all() and (out[9:12] == 0).all()


def test_mla_decode_and_prefill(attn):
    """Absorbed MLA over the latent cache: logits from q_nope.ckv + q_pe.kpe, values ckv, all
    H heads on the one latent head; q_nope a transposed view."""
    g = torch.Generator().manual_seed(4)
    seqs, h, lkv, r, bs = [(1, 20), (3, 9), (2, 2)], 4, 64, 16, 8
    _, _, _, meta = paged_inputs(seqs, hq=1, hkv=1, d=1, dv=1, bs=bs)
    nb = int(meta.block_table.max()) + 1
    t = sum(n for n, _ in seqs)
    q_nope = torch.randn(h, t, lkv, generator=g).transpose(0, 1)
    q_pe = torch.randn(t, h, r, generator=g)
    ckv, kpe = torch.randn(nb, bs, lkv, generator=g), torch.randn(nb, bs, r, generator=g)
    out, lse = attn.mla_attention(q_nope, q_pe, ckv, kpe, meta, scale=0.1, return_lse=True, tuning=tuning("small"))
    want, want_lse = ref.mla_attention(q_nope, q_pe, ckv, kpe, meta, scale=0.1, return_lse=True)
    close(out, want)
    close(lse, want_lse)


def test_tile_table_covers_every_row_once(attn):
    """The device-side tile table: each (sequence, flattened row) in exactly one tile; spare
    grid slots are -1; empty sequences get no tile."""
    from hetero.kernels._attention_launch import tile_table

    cu = torch.tensor([0, 5, 5, 6, 40], dtype=torch.int32)
    seq, start = tile_table(cu, batch=4, total=40, group=3, block_m=16, longest=34)
    covered = {}
    for s, a in zip(seq.tolist(), start.tolist()):
        if s < 0:
            continue
        n = (cu[s + 1] - cu[s]).item() * 3
        for r in range(a, min(a + 16, n)):
            assert (s, r) not in covered
            covered[(s, r)] = True
    assert len(covered) == 40 * 3


def test_cheap_checks(attn):
    q, kc, vc, meta = paged_inputs([(2, 4)], hq=3, hkv=2, d=16, dv=16, bs=4)
    with pytest.raises(OpError, match="dividing"):
        attn.paged_attention(q, kc, vc, meta, scale=1.0, tuning=tuning("small"))
    q, kc, vc, meta = paged_inputs([(2, 4)], hq=4, hkv=2, d=16, dv=16, bs=4)
    with pytest.raises(OpError, match="dtype"):
        attn.paged_attention(q, kc.half(), vc.half(), meta, scale=1.0, tuning=tuning("small"))
    with pytest.raises(OpError, match="window"):
        attn.paged_attention(q, kc, vc, meta, scale=1.0, window=(-2, 0), tuning=tuning("small"))
    with pytest.raises(OpError, match="out"):
        attn.paged_attention(q, kc, vc, meta, scale=1.0, out=torch.empty(2, 4, 8), tuning=tuning("small"))


def test_backend_dispatch_and_empty_batch(triton_backend):
    """Through TritonBackend (the "interpreter" tuning): T = 0 launches nothing."""
    q, kc, vc, meta = paged_inputs([(3, 7)], hq=2, hkv=1, d=16, dv=16, bs=4)
    out = triton_backend.paged_attention(q, kc, vc, meta, scale=0.25)
    close(out, ref.paged_attention(q, kc, vc, meta, scale=0.25))
    empty = AttentionMeta.build([], [], [])
    out, lse = triton_backend.paged_attention(q[:0], kc, vc, empty, scale=0.25, return_lse=True)
    assert out.shape == (0, 2, 16) and lse.shape == (0, 2)
