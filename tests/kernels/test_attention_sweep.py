"""A sweep of the attention kernel's key ranges against the reference (float32, interpreter).

The kernel skips key tiles outside [j_lo, j_hi), the range *any* row of a query tile can see:
j_lo must come from the tile's first row and j_hi from its last. A range taken from one row
for all of them only loses keys when the rows' bounds straddle a BLOCK_N boundary, so the sweep
uses 16 x 16 tiles and crosses it with: window sizes 0, 1, around BLOCK_N and around the tokens
per tile (BLOCK_M / GROUP), left and right; query lengths around BLOCK_M / GROUP and BLOCK_M;
key lengths around BLOCK_N and block-size multiples (a block size that divides neither); GQA
groups 1 and 3 (a group that does not divide BLOCK_M puts a token's heads in two tiles); causal
on and off. Varlen batches carry every length pair in one launch. MLA runs the V_IS_K path
(values from the key tile in registers), the one a GPU takes.
"""

from __future__ import annotations

import pytest
import torch
from test_attention_kernels import paged_inputs

from hetero.kernels.tuning import Tuning, TuningTable
from hetero_cpu_ref import attention as ref

BLOCK = 16
#: (query length, key length): one query / key tile, one either side of a tile edge, fewer keys than queries
SEQS = [(1, 1), (1, 40), (4, 4), (5, 21), (6, 2), (15, 17), (16, 33), (17, 16), (33, 49)]
LEFT = [-1, 0, 1, 5, 6, 15, 16, 17, 33]
RIGHT = [-1, 0, 1, 15, 16, 17]
#: paged metadata has at least as many keys as queries
PAGED_SEQS = [(n, max(n, L)) for n, L in SEQS]


def tuning() -> Tuning:
    tiles = {k: {"BLOCK_M": BLOCK, "BLOCK_N": BLOCK} for k in ("paged_attention", "varlen_attention", "mla_attention")}
    return Tuning(TuningTable(vendor="test", archs={"sweep": tiles}), "sweep", interpreted=True)


@pytest.fixture
def attn():
    from hetero.kernels import attention  # imports Triton: after the fixture switched the interpreter on

    return attention


def close(got, want):
    assert torch.isfinite(got).eq(torch.isfinite(want)).all(), "NaN/Inf pattern differs"
    torch.testing.assert_close(got.float(), want.float(), atol=3e-5, rtol=1e-5)


def varlen_inputs(group: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    cu_q, cu_k = [0], [0]
    for n, L in SEQS:
        cu_q.append(cu_q[-1] + n)
        cu_k.append(cu_k[-1] + L)
    q = torch.randn(cu_q[-1], group, 16, generator=g)
    k = torch.randn(cu_k[-1], 1, 16, generator=g)
    v = torch.randn(cu_k[-1], 1, 16, generator=g)
    return q, k, v, torch.tensor(cu_q, dtype=torch.int32), torch.tensor(cu_k, dtype=torch.int32)


def windows(causal: bool):
    if causal:
        return [(left, -1) for left in LEFT]
    pairs = [(-1, r) for r in RIGHT[1:]] + [(left, -1) for left in LEFT[1:]]
    return pairs + [(1, 0), (0, 1), (5, 16), (16, 5), (17, 15)]


@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("causal", [True, False])
def test_varlen_window_sweep(attn, group, causal):
    q, k, v, cu_q, cu_k = varlen_inputs(group)
    mq, mk = max(n for n, _ in SEQS), max(L for _, L in SEQS)
    for window in windows(causal):
        opts = dict(scale=0.3, causal=causal, window=window, return_lse=True)
        out, lse = attn.varlen_attention(q, k, v, cu_q, cu_k, mq, mk, tuning=tuning(), **opts)
        want, want_lse = ref.varlen_attention(q, k, v, cu_q, cu_k, mq, mk, **opts)
        try:
            close(out, want)
            close(lse, want_lse)
        except AssertionError as e:
            raise AssertionError(f"window {window}: {e}") from None


def sweep_inputs(group: int, bs: int, seed: int = 1):
    """Caches with permuted blocks (one KV head of dim 16) for PAGED_SEQS; the kernel tests' builder."""
    return paged_inputs(PAGED_SEQS, group, 1, 16, 16, bs, seed=seed)


@pytest.mark.parametrize("group,bs", [(1, 7), (3, 8)])
def test_paged_window_sweep(attn, group, bs):
    q, kc, vc, meta = sweep_inputs(group, bs)
    for causal, window in [
        (True, (-1, -1)),
        (True, (6, -1)),
        (True, (17, -1)),
        (False, (5, 16)),
        (False, (-1, 1)),
        (False, (16, 0)),
    ]:
        opts = dict(scale=0.3, causal=causal, window=window, return_lse=True)
        out, lse = attn.paged_attention(q, kc, vc, meta, tuning=tuning(), **opts)
        want, want_lse = ref.paged_attention(q, kc, vc, meta, **opts)
        close(out, want)
        close(lse, want_lse)


@pytest.mark.parametrize("causal", [True, False])
def test_mla_values_from_key_tile(attn, causal):
    """mla_attention with V_IS_K (values = the ckv tile already loaded as keys) under the
    interpreter: 3 heads (tiles straddle tokens), block size 8, latent 32 and rope 16."""
    g = torch.Generator().manual_seed(2)
    _, _, _, meta = sweep_inputs(1, 8)
    t, h = int(meta.query_start_loc[-1]), 3
    nb = int(meta.block_table.max()) + 1
    q_nope, q_pe = torch.randn(t, h, 32, generator=g), torch.randn(t, h, 16, generator=g)
    ckv, kpe = torch.randn(nb, 8, 32, generator=g), torch.randn(nb, 8, 16, generator=g)
    out, lse = attn.mla_attention(
        q_nope, q_pe, ckv, kpe, meta, scale=0.2, causal=causal, return_lse=True, tuning=tuning()
    )
    want, want_lse = ref.mla_attention(q_nope, q_pe, ckv, kpe, meta, scale=0.2, causal=causal, return_lse=True)
    close(out, want)
    close(lse, want_lse)
