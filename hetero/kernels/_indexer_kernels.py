"""Triton kernels of the DSA lightning indexer (private: the launchers live in ``hetero.kernels.dsa``).

* ``index_k_fp8_kernel``: write_index_k's fp8 format. One program per tile of tokens; per token
  and 128-channel group ``s = max(amax, 1e-4) / 448`` and ``clamp(k / s, -448, 448)`` rounded to
  e4m3fn by integer arithmetic (``_e4m3_bits``), stored as raw bytes: bit-exact on every target,
  the interpreter included (whose float8 conversion rounds half up).
* ``indexer_score_kernel``: pass 1 of indexer_topk. Grid (query row of the chunk, span of keys);
  a program reads its row's q [Hi, D] once and streams its span's keys through the block table
  in ``BLOCK_N`` tiles: ``score = sum_h w[h] * relu(q[h] . k)`` (one ``tl.dot`` per tile, float32 sums,
  heads padded to 16), stored into the op's workspace as an order-preserving int32 key.
* ``indexer_select_kernel``: pass 2, one program per row: the keep-th largest key by radix
  select (4 histogram passes of 8 bits over the row's keys, skipped when the row keeps all of
  them), then one pass writing every position whose key is larger and the first positions (in
  increasing order) whose key equals it: exactly the spec's tie rule. Then -1 padding.

Rows reach the kernels as (sequence, position) pairs computed on the device by the launcher (over a
compressed cache, spec 1.8, the position is the row's last visible entry and the lengths count entries);
every index is untrusted: a row's visible key count is clamped into [0, min(seq_len, table
columns * BS, workspace width)] and every block id loaded is masked against [0, NB) (a block
outside it reads as a zero key).
"""

from __future__ import annotations

from hetero.kernels._triton import triton_modules

triton, tl = triton_modules()

__all__ = ["index_k_fp8_kernel", "indexer_score_kernel", "indexer_select_kernel", "SUM", "MAX"]

SUM = tl.standard._sum_combine
MAX = tl.standard._elementwise_max
INT_MIN = tl.constexpr(-2147483648)


@triton.jit
def _e4m3_bits(y):
    """The e4m3fn byte of float32 ``y`` (|y| <= 448, finite), rounded to nearest even, as int32."""
    b = y.to(tl.int32, bitcast=True)
    sign = (b >> 24) & 0x80
    a = b & 0x7FFFFFFF
    e = a >> 23
    # normal range of e4m3 (|y| >= 2**-6, float32 exponent field >= 121): round the mantissa to 3 bits
    normal = ((a + 0x7FFFF + ((a >> 20) & 1)) >> 20) - 960
    # below it: a multiple of 2**-9, q = rne(|y| * 512) in [0, 8] (8 is the smallest normal, byte 8)
    m = (a & 0x7FFFFF) | 0x800000
    s = tl.minimum(tl.maximum(141 - e, 21), 25)
    sub = (m + (1 << (s - 1)) - 1 + ((m >> s) & 1)) >> s
    sub = tl.where(e == 0, 0, sub)
    return sign | tl.where(e >= 121, normal, sub)


@triton.jit
def _e4m3_value(bits):
    """float32 of an e4m3fn byte (int32 in [0, 255]; the NaN bytes never come from the writer)."""
    e = (bits >> 3) & 0xF
    m = bits & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    mag = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)
    return tl.where((bits & 0x80) != 0, -mag, mag)


@triton.jit
def index_k_fp8_kernel(
    k_ptr, slot_ptr, cache_ptr, scale_ptr,
    tokens, num_slots, block_size, groups,
    sk_t, sk_d, s_slot, sc_b, sc_s, sc_d, ss_b, ss_s, ss_g,
    BLOCK_T: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    tm = t < tokens
    slot = tl.load(slot_ptr + t * s_slot, mask=tm, other=-1)
    ok = tm & (slot >= 0) & (slot < num_slots)
    slot = tl.where(ok, slot, 0)
    blk = slot // block_size
    off = slot % block_size
    d = tl.arange(0, 128)
    m = ok[:, None]
    for g in range(0, groups):
        c = g * 128 + d
        k = tl.load(k_ptr + t[:, None] * sk_t + c[None, :] * sk_d, mask=m, other=0.0).to(tl.float32)
        amax = tl.maximum(tl.reduce(tl.abs(k), 1, MAX), 1e-4)
        s = tl.div_rn(amax, tl.full([BLOCK_T], 448.0, tl.float32))
        y = tl.div_rn(k, s[:, None])
        y = tl.minimum(tl.maximum(y, -448.0), 448.0)
        q = _e4m3_bits(y)
        tl.store(cache_ptr + blk[:, None] * sc_b + off[:, None] * sc_s + c[None, :] * sc_d, q.to(tl.uint8), mask=m)
        tl.store(scale_ptr + blk * ss_b + off * ss_s + g * ss_g, s, mask=ok)


@triton.jit
def _visible(row_seq_ptr, row_pos_ptr, kv_len_ptr, t, max_kv_len, width):
    """(sequence, visible key count) of row t, clamped into the tensors."""
    b = tl.load(row_seq_ptr + t).to(tl.int64)
    pos = tl.load(row_pos_ptr + t).to(tl.int64)
    seq_len = tl.minimum(tl.maximum(tl.load(kv_len_ptr + b).to(tl.int64), 0), max_kv_len)
    count = tl.minimum(tl.maximum(tl.minimum(pos + 1, seq_len), 0), width)
    return b, count


@triton.jit
def _key_tile(k_ptr, scale_ptr, table_ptr, j, ok, num_blocks, sk_b, sk_s, sk_d, ss_b, ss_s, ss_g, s_tab_c,
              BS: tl.constexpr, D: tl.constexpr, D_P: tl.constexpr,
              FP8: tl.constexpr, UPCAST: tl.constexpr):  # fmt: skip
    """K^T [D_P, BLOCK_N] of key positions j through the block table (zero where not ok)."""
    blk = tl.load(table_ptr + (j // BS) * s_tab_c, mask=ok, other=0).to(tl.int64)
    ok = ok & (blk >= 0) & (blk < num_blocks)
    blk = tl.where(ok, blk, 0)
    slot = j % BS
    d = tl.arange(0, D_P).to(tl.int64)
    m = ok[None, :] & (d < D)[:, None]
    kt = tl.load(k_ptr + (blk * sk_b + slot * sk_s)[None, :] + d[:, None] * sk_d, mask=m, other=0)
    if FP8:
        sc = tl.load(scale_ptr + (blk * ss_b + slot * ss_s)[None, :] + (d // 128)[:, None] * ss_g, mask=m, other=0.0)
        kt = _e4m3_value(kt.to(tl.int32)) * sc
    elif UPCAST:
        kt = kt.to(tl.float32)
    return kt


@triton.jit
def indexer_score_kernel(
    q_ptr, w_ptr, k_ptr, scale_ptr, table_ptr, row_seq_ptr, row_pos_ptr, kv_len_ptr, ws_ptr,
    row0, num_heads, num_blocks, max_kv_len, width,
    sq_t, sq_h, sq_d, sw_t, sw_h, sk_b, sk_s, sk_d, ss_b, ss_s, ss_g, s_tab, s_tab_c, s_ws,
    BS: tl.constexpr, D: tl.constexpr, D_P: tl.constexpr, HI_P: tl.constexpr, FP8: tl.constexpr,
    UPCAST: tl.constexpr, DOT_PREC: tl.constexpr, SPAN: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0).to(tl.int64)
    t = row0 + r
    b, count = _visible(row_seq_ptr, row_pos_ptr, kv_len_ptr, t, max_kv_len, width)
    j_start = tl.program_id(1).to(tl.int64) * SPAN
    if j_start >= count:
        return
    j_end = tl.minimum(j_start + SPAN, count)
    h = tl.arange(0, HI_P).to(tl.int64)
    hm = h < num_heads
    d = tl.arange(0, D_P).to(tl.int64)
    q = tl.load(
        q_ptr + t * sq_t + h[:, None] * sq_h + d[None, :] * sq_d, mask=hm[:, None] & (d < D)[None, :], other=0.0
    )
    if FP8 or UPCAST:
        q = q.to(tl.float32)
    w = tl.load(w_ptr + t * sw_t + h * sw_h, mask=hm, other=0.0).to(tl.float32)
    table_ptr += b * s_tab
    ws_ptr += r * s_ws
    offs = tl.arange(0, BLOCK_N).to(tl.int64)
    for j0 in range(j_start, j_end, BLOCK_N):
        j = j0 + offs
        ok = j < j_end
        kt = _key_tile(
            k_ptr,
            scale_ptr,
            table_ptr,
            j,
            ok,
            num_blocks,
            sk_b,
            sk_s,
            sk_d,
            ss_b,
            ss_s,
            ss_g,
            s_tab_c,
            BS,
            D,
            D_P,
            FP8,
            UPCAST,
        )
        logits = tl.dot(q, kt.to(q.dtype), input_precision=DOT_PREC)
        score = tl.reduce(tl.maximum(logits, 0.0) * w[:, None], 0, SUM)
        score = tl.where(score == 0.0, 0.0, score)  # -0.0 ties with 0.0
        bits = score.to(tl.int32, bitcast=True)
        key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)  # int32 order = float order
        tl.store(ws_ptr + j, key, mask=ok)


@triton.jit
def _threshold(row_ptr, count, keep, BLOCK: tl.constexpr):
    """(tau, ties): the keep-th largest key of the row's ``count`` keys (int64) and how many keys equal
    to it are kept. Radix select on the unsigned form ``key + 2**31``, 8 bits a pass from the top:
    each pass histograms the next digit of the keys that share the digits chosen so far."""
    offs = tl.arange(0, BLOCK).to(tl.int64)
    bins = tl.arange(0, 256)
    prefix = count * 0
    rem = keep
    for p in tl.static_range(4):
        shift = 24 - 8 * p
        hist = tl.full([256], 0, tl.int32)
        for j0 in range(0, count, BLOCK):
            j = j0 + offs
            v = tl.load(row_ptr + j, mask=j < count, other=0).to(tl.int64) + 2147483648
            m = (j < count) & ((v >> (shift + 8)) == prefix)
            hist += tl.histogram(((v >> shift) & 255).to(tl.int32), 256, mask=m)
        at_least = tl.associative_scan(hist, 0, SUM, reverse=True)  # keys with this digit or a larger one
        digit = tl.reduce(tl.where(at_least >= rem, bins, -1), 0, MAX)
        rem -= tl.reduce(tl.where(bins == digit, at_least - hist, 0), 0, MAX).to(tl.int64)
        prefix = (prefix << 8) | digit.to(tl.int64)
    return prefix - 2147483648, rem


@triton.jit
def indexer_select_kernel(
    ws_ptr, out_ptr, row_seq_ptr, row_pos_ptr, kv_len_ptr,
    row0, max_kv_len, width, topk, s_ws, so_t, so_k,
    BLOCK: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0).to(tl.int64)
    t = row0 + r
    _, count = _visible(row_seq_ptr, row_pos_ptr, kv_len_ptr, t, max_kv_len, width)
    keep = tl.minimum(count, topk)
    row_ptr = ws_ptr + r * s_ws
    tau = tl.full([], INT_MIN, tl.int64) - 1  # keeps every key
    need = keep * 0
    if keep < count:
        tau, need = _threshold(row_ptr, count, keep, BLOCK)
    offs = tl.arange(0, BLOCK).to(tl.int64)
    written = need * 0
    ties = need * 0
    out_ptr += t * so_t
    for j0 in range(0, count, BLOCK):
        j = j0 + offs
        m = j < count
        key = tl.load(row_ptr + j, mask=m, other=INT_MIN).to(tl.int64)
        eq = (m & (key == tau)).to(tl.int64)
        rank = ties + tl.associative_scan(eq, 0, SUM)
        sel = (m & ((key > tau) | ((eq != 0) & (rank <= need)))).to(tl.int64)
        dst = written + tl.associative_scan(sel, 0, SUM) - 1
        tl.store(out_ptr + dst * so_k, j.to(tl.int32), mask=sel != 0)
        written += tl.reduce(sel, 0, SUM)
        ties += tl.reduce(eq, 0, SUM)
    for k0 in range(keep, topk, BLOCK):
        k = k0 + offs
        tl.store(out_ptr + k * so_k, tl.full([BLOCK], -1, tl.int32), mask=k < topk)
