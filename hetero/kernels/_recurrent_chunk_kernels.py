"""The chunked (WY / UT) gated delta rule kernel (private: launched by ``hetero.kernels.recurrent``).

One program per (sequence, value head, ``BV`` columns of the state) walks its sequence in
chunks of ``BT`` rows, keeping S[:, V block] (float32) in registers between chunks and
writing it back once. For a chunk with state S0 at its start, rows i, j of the chunk,
G = the cumulative sum of the log-decays inside the chunk (per head, or per key channel for
KDA) and Gamma_i = diag(exp(G_i)), the spec's row-by-row recurrence unrolls to::

    A[i, j] = beta_i * k_i^T Gamma_i Gamma_j^-1 k_j      (j < i)      strictly lower
    P[i, j] = q_i^T Gamma_i Gamma_j^-1 k_j               (j <= i)     the intra-chunk attention
    U       = (I + A)^-1 diag(beta) (V - (Gamma k) S0)   the UT transform: every row's correction
    O       = (Gamma q) S0 + P U
    S1      = Gamma_last S0 + (Gamma_last Gamma^-1 k)^T U

Every product above is a ``tl.dot`` on float32 operands (``DOT_PREC``: "ieee", or "tf32x3" on
NVIDIA, where an "ieee" dot becomes FMA loops; both about as accurate as float32 arithmetic).
(I + A)^-1 is built by block doubling: the inverse of the block diagonal of 2s-blocks is
``T - T E T`` from that of the s-blocks (E: A's entries between the two halves of each
2s-block), log2(BT) - 1 steps of two dots each; this is the blocked forward substitution,
without the powers of A a Neumann product would form (those grow past float32's precision).

Decays are only ever taken as exp(G_i - G_j) with i >= j, exp(G_i) and exp(G_last - G_j), never
exp(-G_j) alone, so a strong decay underflows to 0 instead of overflowing. For KDA the
per-channel exp(G_ir - G_jr) cannot factor into a dot safely, so A and P are built one column
j at a time ([BT, K] elementwise work per column).

Padded rows (past the sequence's end) load k = q = v = g = beta = 0 and so change nothing.
"""

from __future__ import annotations

from hetero.kernels._recurrent_kernels import _seq_rows, _slot_of
from hetero.kernels._rounding import cast_out
from hetero.kernels._triton import triton_modules

triton, tl = triton_modules()

__all__ = ["gdn_chunk_kernel"]

_SUM = tl.standard._sum_combine


@triton.jit
def _rows(ptr, rows, row_ok, head, s_t, s_h, s_d, offs_k, k_ok, L2NORM: tl.constexpr, eps):
    """[BT, K_P] float32 rows of q or k for one head, l2-normalized when asked."""
    x = tl.load(
        ptr + rows[:, None] * s_t + head * s_h + offs_k[None, :] * s_d, mask=row_ok[:, None] & k_ok[None, :], other=0.0
    ).to(tl.float32)
    if L2NORM:
        x = x / tl.sqrt(tl.reduce(x * x, 1, _SUM) + eps)[:, None]
    return x


@triton.jit
def _decays_per_head(g, q, k, BT: tl.constexpr, K_P: tl.constexpr, DOT_PREC: tl.constexpr):
    """Gated DeltaNet (g [BT]): (A without beta, P, Gamma q, Gamma k, Gamma_last Gamma^-1 k, exp(G_last) [K_P])."""
    cum = tl.associative_scan(g, 0, _SUM)
    ar = tl.arange(0, BT)
    last = tl.reduce(tl.where(ar == BT - 1, cum, 0.0), 0, _SUM)
    decay = tl.exp(tl.where(ar[:, None] >= ar[None, :], cum[:, None] - cum[None, :], float("-inf")))
    a = tl.dot(k, tl.trans(k), input_precision=DOT_PREC) * decay
    p = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * decay
    e = tl.exp(cum)[:, None]
    return a, p, q * e, k * e, k * tl.exp(last - cum)[:, None], tl.full([K_P], 1.0, tl.float32) * tl.exp(last)


@triton.jit
def _decays_per_channel(g, q, k, BT: tl.constexpr):
    """KDA (g [BT, K_P]): as ``_decays_per_head``, A and P built column by column."""
    cum = tl.associative_scan(g, 0, _SUM)
    ar = tl.arange(0, BT)
    last = tl.reduce(tl.where((ar == BT - 1)[:, None], cum, 0.0), 0, _SUM)
    a = tl.full([BT, BT], 0.0, tl.float32)
    p = tl.full([BT, BT], 0.0, tl.float32)
    for j in range(0, BT):
        pick = (ar == j)[:, None]
        kj = tl.reduce(tl.where(pick, k, 0.0), 0, _SUM)
        cj = tl.reduce(tl.where(pick, cum, 0.0), 0, _SUM)
        kd = tl.exp(tl.where((ar >= j)[:, None], cum - cj[None, :], float("-inf"))) * kj[None, :]  # rows i >= j only
        col = (ar == j)[None, :]
        a = tl.where(col, tl.reduce(k * kd, 1, _SUM)[:, None], a)
        p = tl.where(col, tl.reduce(q * kd, 1, _SUM)[:, None], p)
    e = tl.exp(cum)
    return a, p, q * e, k * e, k * tl.exp(last[None, :] - cum), tl.exp(last)


@triton.jit
def _unit_lower_inverse(a, BT: tl.constexpr, LOG_BT: tl.constexpr, DOT_PREC: tl.constexpr):
    """(I + a)^-1 for a strictly lower [BT, BT] a, by doubling the diagonal block size."""
    ar = tl.arange(0, BT)
    ii = ar[:, None]
    jj = ar[None, :]
    inv = tl.where(ii == jj, 1.0, 0.0) - tl.where((ii >> 1) == (jj >> 1), a, 0.0)  # 2-blocks: I - E
    for lvl in tl.static_range(1, LOG_BT):
        e = tl.where(((ii >> (lvl + 1)) == (jj >> (lvl + 1))) & ((ii >> lvl) != (jj >> lvl)), a, 0.0)
        inv = inv - tl.dot(inv, tl.dot(e, inv, input_precision=DOT_PREC), input_precision=DOT_PREC)
    return inv


@triton.jit
def gdn_chunk_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, state_ptr, out_ptr, qsl_ptr, slot_ptr, init_ptr,
    sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, sv_t, sv_h, sv_d, sg_t, sg_h, sg_d, sb_t, sb_h,
    ss_s, ss_h, ss_k, ss_v, so_t, so_h, so_d,
    scale, eps, num_rows, num_slots,
    GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, K_P: tl.constexpr, BV: tl.constexpr,
    BT: tl.constexpr, LOG_BT: tl.constexpr, KDA: tl.constexpr, L2NORM: tl.constexpr, DOT_PREC: tl.constexpr,
    RNE_BF16: tl.constexpr,
):  # fmt: skip
    """One (sequence, value head, V block): every chunk of BT rows in order, the state carried in registers."""
    n = tl.program_id(0)
    hv = tl.program_id(1).to(tl.int64)
    start, length = _seq_rows(qsl_ptr, n, num_rows)
    slot, live, init = _slot_of(slot_ptr, init_ptr, n, num_slots)
    hk = hv // GROUP
    offs_k = tl.arange(0, K_P).to(tl.int64)
    k_ok = offs_k < K
    offs_v = tl.program_id(2) * BV + tl.arange(0, BV).to(tl.int64)
    v_ok = offs_v < V
    ar = tl.arange(0, BT)
    s_ptrs = state_ptr + slot * ss_s + hv * ss_h + offs_k[:, None] * ss_k + offs_v[None, :] * ss_v
    s_ok = k_ok[:, None] & v_ok[None, :]
    s = tl.load(s_ptrs, mask=k_ok[:, None] & (offs_v < V * init)[None, :], other=0.0).to(tl.float32)  # init 0: unread
    for c0 in range(0, length, BT):
        row_ok = c0 + ar < length
        rows = start + c0 + ar.to(tl.int64)
        q = _rows(q_ptr, rows, row_ok, hk, sq_t, sq_h, sq_d, offs_k, k_ok, L2NORM, eps) * scale
        k = _rows(k_ptr, rows, row_ok, hk, sk_t, sk_h, sk_d, offs_k, k_ok, L2NORM, eps)
        v = tl.load(
            v_ptr + rows[:, None] * sv_t + hv * sv_h + offs_v[None, :] * sv_d,
            mask=row_ok[:, None] & v_ok[None, :],
            other=0.0,
        ).to(tl.float32)
        beta = tl.load(beta_ptr + rows * sb_t + hv * sb_h, mask=row_ok, other=0.0).to(tl.float32)
        if KDA:
            g = tl.load(
                g_ptr + rows[:, None] * sg_t + hv * sg_h + offs_k[None, :] * sg_d,
                mask=row_ok[:, None] & k_ok[None, :],
                other=0.0,
            ).to(tl.float32)
            a, p, qg, kg, kd, s_decay = _decays_per_channel(g, q, k, BT)
        else:
            g = tl.load(g_ptr + rows * sg_t + hv * sg_h, mask=row_ok, other=0.0).to(tl.float32)
            a, p, qg, kg, kd, s_decay = _decays_per_head(g, q, k, BT, K_P, DOT_PREC)
        a = tl.where(ar[:, None] > ar[None, :], a, 0.0) * beta[:, None]
        inv = _unit_lower_inverse(a, BT, LOG_BT, DOT_PREC)
        u = tl.dot(inv, beta[:, None] * (v - tl.dot(kg, s, input_precision=DOT_PREC)), input_precision=DOT_PREC)
        o = tl.dot(qg, s, input_precision=DOT_PREC) + tl.dot(p, u, input_precision=DOT_PREC)
        s = s_decay[:, None] * s + tl.dot(tl.trans(kd), u, input_precision=DOT_PREC)
        o = tl.where(live, o, 0.0)  # a skipped sequence's rows are 0
        o_ptrs = out_ptr + rows[:, None] * so_t + hv * so_h + offs_v[None, :] * so_d
        tl.store(o_ptrs, cast_out(o, out_ptr.dtype.element_ty, RNE_BF16), mask=row_ok[:, None] & v_ok[None, :])
    if live & (length > 0):  # an empty sequence touches nothing
        tl.store(s_ptrs, s.to(state_ptr.dtype.element_ty), mask=s_ok)
