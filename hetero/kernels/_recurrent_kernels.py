"""Triton kernels of the recurrent ops (private: the launchers live in ``hetero.kernels.recurrent``).

* ``causal_conv1d_kernel``: grid (sequence, channel block, part). Each sequence's rows are cut
  into ``num_programs(2)`` contiguous parts, each a whole number of ``BLOCK_T``-row tiles; a
  program loops over its part's tiles. Each output tile is W shifted loads of x (the same rows,
  served by L1/L2 after the first) times a weight column, summed in float32 (float64 for
  float64 inputs). Rows before the sequence's first come from the state (or 0 without one).
  Only part 0 touches the slot: its first tile reads the old state (``BLOCK_T >= W-1``, so no
  other tile or part needs it), and after its loop it writes the new state, the last W-1 inputs
  (x rows, or old state rows when L < W-1, loaded first), behind a barrier: the threads that
  read old state rows for the convolution are done before any thread overwrites them.
* ``gdn_recurrent_kernel``: the gated delta rule token by token, one program per (sequence,
  value head, ``BV`` columns of the state). The program keeps S[:, V block] (float32) in
  registers over its rows and writes it back once: the decode path (one row per sequence),
  one launch for the whole batch.

Per-token state slots [N, M] (spec 1.11, constexpr ``PER_TOKEN``; the [N] path compiles as before):
the slot read is column ``num_accepted_tokens - 1`` (``_token_slot_of``); ``gdn_recurrent_kernel``
stores S after every row that names a slot, ``causal_conv1d_kernel`` (one part per sequence) writes
each row's window of the last W-1 inputs after its convolution, the one into the slot it read last.

Index metadata is untrusted (``_seq_rows``, ``_slot_of``): query_start_loc entries are clamped
into [0, T] (a decreasing pair is an empty sequence), a slot outside [0, S) skips the sequence
like -1 (its rows are 0, no state read or written), has_initial_state False masks every state
read. Reductions and scans are ``tl.reduce`` / ``tl.associative_scan`` with Triton's own combine
function, not ``tl.sum`` / ``tl.cumsum`` (jit functions the interpreter runs only when
TRITON_INTERPRET was set before Triton's first import; see ``_gemm_kernels``).
"""

from __future__ import annotations

from hetero.kernels._rounding import cast_out
from hetero.kernels._triton import triton_modules

triton, tl = triton_modules()

__all__ = ["causal_conv1d_kernel", "gdn_recurrent_kernel"]

_SUM = tl.standard._sum_combine


@triton.jit
def _seq_rows(qsl_ptr, n, num_rows):
    """(first row, row count) of sequence n, both clamped into the T rows (int64)."""
    start = tl.minimum(tl.maximum(tl.load(qsl_ptr + n).to(tl.int64), 0), num_rows)
    end = tl.minimum(tl.maximum(tl.load(qsl_ptr + n + 1).to(tl.int64), 0), num_rows)
    return start, tl.maximum(end - start, 0)


@triton.jit
def _slot_of(slot_ptr, init_ptr, n, num_slots):
    """(slot clamped into [0, S), whether the sequence is live, 1 if its state is read else 0).

    The last is an int32 that masks scale their bounds by (``offs < V * init``): triton 3.9's
    interpreter rejects a load mask made by broadcasting a boolean scalar into a tensor."""
    raw = tl.load(slot_ptr + n).to(tl.int64)
    live = (raw >= 0) & (raw < num_slots)
    init = tl.where(live & (tl.load(init_ptr + n) != 0), 1, 0)
    return tl.where(live, raw, 0), live, init


@triton.jit
def _token_slot_of(slot_ptr, acc_ptr, init_ptr, n, M, num_slots, HAS_ACCEPTED: tl.constexpr):
    """Per-token slots [N, M] (spec 1.11): (the slot read, clamped into [0, S); whether the sequence is
    live, its column 0 in [0, S); 1 if its state is read else 0). The column read is
    ``num_accepted_tokens[n] - 1`` clamped into [0, M) (0 without the tensor); a slot out of [0, S)
    there reads nothing."""
    raw0 = tl.load(slot_ptr + n * M).to(tl.int64)
    live = (raw0 >= 0) & (raw0 < num_slots)
    col = 0
    if HAS_ACCEPTED:
        col = tl.minimum(tl.maximum(tl.load(acc_ptr + n).to(tl.int64) - 1, 0), M - 1)
    raw = tl.load(slot_ptr + n * M + col).to(tl.int64)
    ok = (raw >= 0) & (raw < num_slots)
    init = tl.where(live & ok & (tl.load(init_ptr + n) != 0), 1, 0)
    return tl.where(ok, raw, 0), live, init


@triton.jit
def _conv_token_writes(
    x_ptr, base_ptr, old_ptr, out_slot_ptr, start, length, read, init, M, num_slots, offs_c, c_ok,
    sx_t, sx_c, ss_s, ss_w, ss_c, W: tl.constexpr, W1_P: tl.constexpr,
):  # fmt: skip
    """conv_state[state_slots[n, t]] = xx[t+1 : t+W] for each row t < min(L, M) naming a slot. A write
    to the slot read waits for the others (pass 1): they may still need its old rows."""
    jr = tl.arange(0, W1_P).to(tl.int64)
    j_ok = jr < W - 1
    for p in tl.static_range(2):
        for t in range(0, tl.minimum(length, M)):
            raw = tl.load(out_slot_ptr + t).to(tl.int64)
            last = (raw == read) & (init == 1)
            if p == 0:
                ok = (raw >= 0) & (raw < num_slots) & (last == 0)
            else:
                ok = (raw >= 0) & (raw < num_slots) & last
            if ok:
                src = t + jr + 2 - W  # window row jr = xx[t+1+jr]: x row src, or old state row t+1+jr
                nx = tl.load(
                    x_ptr + (start + src)[:, None] * sx_t + offs_c[None, :] * sx_c,
                    mask=(j_ok & (src >= 0))[:, None] & c_ok[None, :],
                    other=0.0,
                )
                ns = tl.load(
                    old_ptr + (t + 1 + jr)[:, None] * ss_w + offs_c[None, :] * ss_c,
                    mask=(j_ok & (src < 0) & (src >= (1 - W) * init))[:, None] & c_ok[None, :],
                    other=0.0,
                )
                new = tl.where((src >= 0)[:, None], nx, ns.to(nx.dtype))
                tl.debug_barrier()  # this program's reads of the old rows are done before it overwrites them
                tl.store(
                    base_ptr + raw * ss_s + jr[:, None] * ss_w + offs_c[None, :] * ss_c,
                    new.to(base_ptr.dtype.element_ty),
                    mask=j_ok[:, None] & c_ok[None, :],
                )


@triton.jit
def causal_conv1d_kernel(
    x_ptr, w_ptr, b_ptr, state_ptr, out_ptr, qsl_ptr, slot_ptr, init_ptr, acc_ptr,
    sx_t, sx_c, sw_c, sw_w, ss_s, ss_w, ss_c, so_t, so_c,
    num_rows, num_slots, C, M,
    W: tl.constexpr, W1_P: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr, ACC: tl.constexpr,
    RNE_BF16: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
    PER_TOKEN: tl.constexpr, HAS_ACCEPTED: tl.constexpr,
):  # fmt: skip
    """out[s+t] = act(sum_j weight[:, j] * xx[t+j] + bias) over one part of one sequence's rows."""
    n = tl.program_id(0)
    part = tl.program_id(2)
    start, length = _seq_rows(qsl_ptr, n, num_rows)
    if PER_TOKEN:
        slot, live, init = _token_slot_of(slot_ptr, acc_ptr, init_ptr, n, M, num_slots, HAS_ACCEPTED)
    else:
        slot, live, init = _slot_of(slot_ptr, init_ptr, n, num_slots)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C).to(tl.int64)
    c_ok = offs_c < C
    base_ptr = state_ptr
    state_ptr += slot * ss_s
    # the part's rows [lo, hi): whole tiles, so every part but the first starts at row >= BLOCK_T >= W-1
    part_len = ((length + tl.num_programs(2) - 1) // tl.num_programs(2) + BLOCK_T - 1) // BLOCK_T * BLOCK_T
    lo = part * part_len
    hi = tl.minimum(lo + part_len, length)
    if HAS_BIAS:
        bias = tl.load(b_ptr + offs_c, mask=c_ok, other=0.0).to(ACC)
    for t0 in range(lo, hi, BLOCK_T):
        tt = t0 + tl.arange(0, BLOCK_T).to(tl.int64)
        t_ok = tt < hi
        acc = tl.full([BLOCK_T, BLOCK_C], 0.0, ACC)
        for j in tl.static_range(W):
            src = tt + (j - (W - 1))  # the sequence's row feeding tap j; < 0: state row W-1 + src
            xm = (t_ok & (src >= 0))[:, None] & c_ok[None, :]
            xv = tl.load(x_ptr + (start + src)[:, None] * sx_t + offs_c[None, :] * sx_c, mask=xm, other=0.0)
            sm = (t_ok & (src < 0) & (src >= (1 - W) * init))[:, None] & c_ok[None, :]  # init 0: never
            sv = tl.load(state_ptr + (tt + j)[:, None] * ss_w + offs_c[None, :] * ss_c, mask=sm, other=0.0)
            wj = tl.load(w_ptr + offs_c * sw_c + j * sw_w, mask=c_ok, other=0.0).to(ACC)
            acc += (xv.to(ACC) + sv.to(ACC)) * wj[None, :]
        if HAS_BIAS:
            acc += bias[None, :]
        if SILU:
            acc = acc / (1.0 + tl.exp(-acc))
        acc = tl.where(live, acc, 0.0)  # a skipped sequence's rows are 0
        o_ptrs = out_ptr + (start + tt)[:, None] * so_t + offs_c[None, :] * so_c
        tl.store(o_ptrs, cast_out(acc, out_ptr.dtype.element_ty, RNE_BF16), mask=t_ok[:, None] & c_ok[None, :])
    if PER_TOKEN:  # one part (the launcher's): the program reads the old rows and writes every per-token state
        if live & (length > 0):
            tl.debug_barrier()  # every old-state read of the convolution (other threads' too) is done
            _conv_token_writes(
                x_ptr, base_ptr, state_ptr, slot_ptr + n * M, start, length, slot, init, M, num_slots, offs_c, c_ok,
                sx_t, sx_c, ss_s, ss_w, ss_c, W, W1_P,
            )  # fmt: skip
    elif (part == 0) & live & (length > 0):  # an empty sequence touches nothing
        jr = tl.arange(0, W1_P).to(tl.int64)
        src = length + jr - (W - 1)  # new state row jr = xx[L + jr]: x row src, or old state row L + jr
        j_ok = jr < W - 1
        nx = tl.load(
            x_ptr + (start + src)[:, None] * sx_t + offs_c[None, :] * sx_c,
            mask=(j_ok & (src >= 0))[:, None] & c_ok[None, :],
            other=0.0,
        )
        ns = tl.load(
            state_ptr + (length + jr)[:, None] * ss_w + offs_c[None, :] * ss_c,
            mask=(j_ok & (src < 0) & (src >= (1 - W) * init))[:, None] & c_ok[None, :],
            other=0.0,
        )
        new = tl.where((src >= 0)[:, None], nx, ns.to(nx.dtype))  # exact copies of inputs
        tl.debug_barrier()  # every old-state read of this program (other threads' too) is done
        tl.store(
            state_ptr + jr[:, None] * ss_w + offs_c[None, :] * ss_c,
            new.to(state_ptr.dtype.element_ty),
            mask=j_ok[:, None] & c_ok[None, :],
        )


@triton.jit
def gdn_recurrent_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, state_ptr, out_ptr, qsl_ptr, slot_ptr, init_ptr, acc_ptr,
    sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, sv_t, sv_h, sv_d, sg_t, sg_h, sg_d, sb_t, sb_h,
    ss_s, ss_h, ss_k, ss_v, so_t, so_h, so_d,
    scale, eps, num_rows, num_slots, M,
    GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, K_P: tl.constexpr, BV: tl.constexpr,
    KDA: tl.constexpr, L2NORM: tl.constexpr, RNE_BF16: tl.constexpr,
    PER_TOKEN: tl.constexpr, HAS_ACCEPTED: tl.constexpr,
):  # fmt: skip
    """The spec's recurrence, row by row, for one (sequence, value head, V block). Per-token slots:
    S is stored after every row whose column names a slot in [0, S) (rows past M store nothing)."""
    n = tl.program_id(0)
    hv = tl.program_id(1).to(tl.int64)
    start, length = _seq_rows(qsl_ptr, n, num_rows)
    if PER_TOKEN:
        slot, live, init = _token_slot_of(slot_ptr, acc_ptr, init_ptr, n, M, num_slots, HAS_ACCEPTED)
    else:
        slot, live, init = _slot_of(slot_ptr, init_ptr, n, num_slots)
    hk = hv // GROUP
    offs_k = tl.arange(0, K_P).to(tl.int64)
    k_ok = offs_k < K
    offs_v = tl.program_id(2) * BV + tl.arange(0, BV).to(tl.int64)
    v_ok = offs_v < V
    s_ptrs = state_ptr + slot * ss_s + hv * ss_h + offs_k[:, None] * ss_k + offs_v[None, :] * ss_v
    s_ok = k_ok[:, None] & v_ok[None, :]
    s = tl.load(s_ptrs, mask=k_ok[:, None] & (offs_v < V * init)[None, :], other=0.0).to(tl.float32)  # init 0: unread
    for t in range(0, length):
        row = start + t
        q = tl.load(q_ptr + row * sq_t + hk * sq_h + offs_k * sq_d, mask=k_ok, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + row * sk_t + hk * sk_h + offs_k * sk_d, mask=k_ok, other=0.0).to(tl.float32)
        if L2NORM:
            q = q / tl.sqrt(tl.reduce(q * q, 0, _SUM) + eps)
            k = k / tl.sqrt(tl.reduce(k * k, 0, _SUM) + eps)
        v = tl.load(v_ptr + row * sv_t + hv * sv_h + offs_v * sv_d, mask=v_ok, other=0.0).to(tl.float32)
        beta = tl.load(beta_ptr + row * sb_t + hv * sb_h).to(tl.float32)
        if KDA:  # one decay per key channel: row r of S
            gk = tl.load(g_ptr + row * sg_t + hv * sg_h + offs_k * sg_d, mask=k_ok, other=0.0).to(tl.float32)
            s = s * tl.exp(gk)[:, None]
        else:
            s = s * tl.exp(tl.load(g_ptr + row * sg_t + hv * sg_h).to(tl.float32))
        u = beta * (v - tl.reduce(k[:, None] * s, 0, _SUM))  # the correction toward v
        s = s + k[:, None] * u[None, :]
        o = tl.reduce((q * scale)[:, None] * s, 0, _SUM)
        o = tl.where(live, o, 0.0)
        tl.store(
            out_ptr + row * so_t + hv * so_h + offs_v * so_d, cast_out(o, out_ptr.dtype.element_ty, RNE_BF16), mask=v_ok
        )
        if PER_TOKEN:
            raw = tl.load(slot_ptr + n * M + tl.minimum(t, M - 1)).to(tl.int64)
            if live & (t < M) & (raw >= 0) & (raw < num_slots):
                t_ptrs = state_ptr + raw * ss_s + hv * ss_h + offs_k[:, None] * ss_k + offs_v[None, :] * ss_v
                tl.store(t_ptrs, s.to(state_ptr.dtype.element_ty), mask=s_ok)
    if not PER_TOKEN:
        if live & (length > 0):
            tl.store(s_ptrs, s.to(state_ptr.dtype.element_ty), mask=s_ok)
