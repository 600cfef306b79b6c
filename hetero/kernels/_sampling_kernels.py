"""Triton kernel of rejection_sample (private: the launcher lives in ``hetero.kernels.sampling``).

``rs_token_kernel``: one program per BLOCK_T draft positions, each position independent of the
others. Pass 1 over tiles of the vocabulary keeps the row's argmax (the lowest index among the
maxima) and, with RANDOM, the total W of the residual's integer weights; pass 2 (RANDOM) finds the
recovered token as the first index whose running weight exceeds ``r mod W``. Integer weights
make both sums exact whatever the tiling, so every backend draws the same token. Reductions
and the scan are ``tl.reduce``/``tl.associative_scan`` builtins (see ``_layer_kernels``). The hash of
``hetero.spec.sampling`` runs on uint32. Draft ids are clamped into [0, V) before any load.
"""

from __future__ import annotations

from hetero.kernels._layer_kernels import _SUM_COMBINE
from hetero.kernels._triton import triton_modules

triton, tl = triton_modules()

__all__ = ["rs_token_kernel"]

_MAX = tl.standard._elementwise_max
_MIN = tl.standard._elementwise_min


@triton.jit
def _mix(x):
    x = x ^ (x >> 16)
    x = x * tl.full(x.shape, 0x7FEB352D, tl.uint32)
    x = x ^ (x >> 15)
    x = x * tl.full(x.shape, 0x846CA68B, tl.uint32)
    return x ^ (x >> 16)


@triton.jit
def rs_token_kernel(
    p_ptr, q_ptr, x_ptr, req_ptr, j_ptr, seed_ptr, greedy_ptr, ok_ptr, tok_ptr,
    n, vocab, stride_p, stride_q,
    HAS_Q: tl.constexpr, RANDOM: tl.constexpr, SCALE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    rmask = rows < n
    x = tl.minimum(tl.maximum(tl.load(x_ptr + rows, mask=rmask, other=0).to(tl.int64), 0), vocab - 1)
    prow = p_ptr + rows.to(tl.int64)[:, None] * stride_p
    qrow = q_ptr + rows.to(tl.int64)[:, None] * stride_q
    best = tl.full([BLOCK_T], float("-inf"), tl.float32)
    top = tl.full([BLOCK_T], 0, tl.int64)
    total = tl.full([BLOCK_T], 0, tl.int64)
    for v0 in range(0, vocab, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V).to(tl.int64)
        m2 = rmask[:, None] & (cols < vocab)[None, :]
        p = tl.load(prow + cols[None, :], mask=m2, other=float("-inf")).to(tl.float32)
        tile_max = tl.reduce(p, 1, _MAX)
        tile_top = tl.reduce(tl.where(p == tile_max[:, None], cols[None, :], vocab), 1, _MIN)
        better = tile_max > best  # strict: an earlier tile keeps a tie
        top = tl.where(better, tile_top, top)
        best = tl.where(better, tile_max, best)
        if RANDOM:
            total += tl.reduce(_weights(p, qrow, cols, x, m2, HAS_Q, SCALE), 1, _SUM_COMBINE)
    ok = top == x
    tok = top
    if RANDOM:
        seed = tl.load(seed_ptr + tl.load(req_ptr + rows, mask=rmask, other=0), mask=rmask, other=0).to(tl.int64)
        j = tl.load(j_ptr + rows, mask=rmask, other=0).to(tl.uint32)
        base = _mix(_mix(_mix((seed >> 32).to(tl.uint32)) ^ seed.to(tl.uint32)) ^ j)
        k0 = _mix(base)
        k1 = _mix(base ^ tl.full([BLOCK_T], 1, tl.uint32))
        k2 = _mix(base ^ tl.full([BLOCK_T], 2, tl.uint32))
        u = ((k0 >> 8) + 1).to(tl.float64) * (1.0 / 16777216.0)
        px = tl.load(p_ptr + rows.to(tl.int64) * stride_p + x, mask=rmask, other=0.0).to(tl.float64)
        if HAS_Q:
            qx = tl.load(q_ptr + rows.to(tl.int64) * stride_q + x, mask=rmask, other=0.0).to(tl.float64)
        else:
            qx = tl.full([BLOCK_T], 1.0, tl.float64)
        random_ok = (qx > 0) & (px >= u * qx)
        target = ((k1 >> 1).to(tl.int64) << 32 | k2.to(tl.int64)) % tl.maximum(total, 1)
        run = tl.full([BLOCK_T], 0, tl.int64)
        found = tl.full([BLOCK_T], -1, tl.int64)
        for v0 in range(0, vocab, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V).to(tl.int64)
            m2 = rmask[:, None] & (cols < vocab)[None, :]
            p = tl.load(prow + cols[None, :], mask=m2, other=0.0).to(tl.float32)
            w = _weights(p, qrow, cols, x, m2, HAS_Q, SCALE)
            hit = (tl.associative_scan(w, 1, _SUM_COMBINE) + run[:, None]) > target[:, None]
            first = tl.reduce(tl.where(hit, cols[None, :], vocab), 1, _MIN)
            found = tl.where((found < 0) & (first < vocab), first, found)
            run += tl.reduce(w, 1, _SUM_COMBINE)
        recovered = tl.where(total > 0, found, top)
        greedy = tl.load(greedy_ptr + tl.load(req_ptr + rows, mask=rmask, other=0), mask=rmask, other=1) != 0
        ok = tl.where(greedy, ok, random_ok)
        tok = tl.where(greedy, top, tl.where(random_ok, x, recovered))
    tl.store(ok_ptr + rows, ok.to(tl.int8), mask=rmask)
    tl.store(tok_ptr + rows, tok, mask=rmask)


@triton.jit
def _weights(p, qrow, cols, x, m2, HAS_Q: tl.constexpr, SCALE: tl.constexpr):
    """floor(residual * SCALE) as int64 for a [BLOCK_T, BLOCK_V] tile; p is float32, 0 where masked."""
    p = tl.where(m2, p, 0.0)
    if HAS_Q:
        q = tl.load(qrow + cols[None, :], mask=m2, other=0.0).to(tl.float32)
        res = tl.maximum(p - q, 0.0)
    else:
        res = tl.where(cols[None, :] == x[:, None], 0.0, p)
    return tl.floor(res.to(tl.float64) * SCALE).to(tl.int64)
