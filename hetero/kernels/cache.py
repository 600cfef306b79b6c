"""Triton kernels of the KV-cache ops: write_kv, write_mla_kv, write_index_k (scatter into the paged
cache, in place) and merge_attention (combine two partial attentions by their lse).

Semantics: ``hetero.spec.attention``. Every tensor is addressed through its strides, so keys
and values may be slices of a packed qkv tensor, the caches the K/V halves of one
[NB, 2, BS, H, D] tensor, and the lse transposed [H, T] views as flash-attn returns them;
nothing is copied to make it contiguous.

Launch shapes (what a GPU runs):

* write_kv / write_mla_kv: one program per (token, tile of heads); a program loads its
  token's slot, and a slot of -1 (or any slot outside the cache) masks every load and store
  of that token, so a skipped token costs one 8-byte read. When all heads fit in the tile
  with room to spare, one program takes several tokens (the tile's rows are (token, head)
  pairs): never for GQA heads with the GPU defaults, two tokens for MLA's single 512-wide
  head, many under the interpreter's big tiles. MLA is the same kernel with one "head" (the
  latent and the rope key as the two tensors); write_index_k's plain format is the same kernel with one
  head and an empty value. Its fp8 format is ``_indexer_kernels.index_k_fp8_kernel`` (one program per
  tile of tokens, each 128-channel group quantized in float32 with integer round-to-nearest-even).
* merge_attention: one program per tile of (token, head) rows; the row weights are computed
  once per row in float32 relative to the larger lse (no overflow for large lse), then the
  head dimension is streamed in chunks.

Tiles come from the tuning table's "elementwise" entry (``BLOCK`` elements per program).
bf16 outputs are rounded through ``layers.cast_out`` (round-to-nearest-even by hand under the
interpreter, which truncates).
"""

from __future__ import annotations

import torch

from hetero.kernels import _indexer_kernels as ik
from hetero.kernels._triton import triton_modules
from hetero.kernels.layers import cast_out, rne_bf16
from hetero.kernels.tuning import Tuning
from hetero.spec._checks_dsa import check_index_k_write
from hetero.spec.attention import INDEX_SCALE_GROUP
from hetero.spec.checks import check_kv_write, check_same_device, check_tensor
from hetero.spec.types import FLOAT_DTYPES

triton, tl = triton_modules()

__all__ = ["write_kv", "write_mla_kv", "write_index_k", "merge_attention"]

_STAT_DTYPES = (torch.float32, torch.float64)


def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def _block(tuning: Tuning) -> tuple[int, dict]:
    """(elements per program, launch options) of the "elementwise" entry."""
    meta, launch = Tuning.launch_options(tuning("elementwise"))
    return int(meta.get("BLOCK", 1024)), launch


# ----------------------------------------------------------------------------- kernels


@triton.jit
def _scatter_kv_kernel(
    slot_ptr, k_ptr, v_ptr, kc_ptr, vc_ptr,
    tokens, num_heads, dim_k, dim_v, block_size, num_slots,
    s_slot,
    sk_t, sk_h, sk_d, sv_t, sv_h, sv_d,
    skc_b, skc_s, skc_h, skc_d,
    svc_b, svc_s, svc_h, svc_d,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    """k_cache[slot // BS, slot % BS, h, :] = key[t, h, :] (and the same for value) for the
    tokens [pid0 * BLOCK_T, ...) and heads [pid1 * BLOCK_H, ...); nothing where the slot is -1.

    The tile's rows are (token, head) pairs, token-major; with BLOCK_T = 1 (what the GPU
    tables give for real head counts) a program is one token's tile of heads."""
    j = tl.arange(0, BLOCK_T * BLOCK_H)
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + j // BLOCK_H
    h = tl.program_id(1) * BLOCK_H + j % BLOCK_H
    tm = t < tokens
    slot = tl.load(slot_ptr + t * s_slot, mask=tm, other=-1)  # BLOCK_T = 1: one address, one read
    rm = tm & (h < num_heads) & (slot >= 0) & (slot < num_slots)
    slot = tl.where(rm, slot, 0)
    blk = slot // block_size
    off = slot % block_size

    dk = tl.arange(0, BLOCK_DK)
    src = k_ptr + t[:, None] * sk_t + h[:, None] * sk_h
    dst = kc_ptr + blk[:, None] * skc_b + off[:, None] * skc_s + h[:, None] * skc_h
    for d0 in range(0, dim_k, BLOCK_DK):
        d = d0 + dk
        m = rm[:, None] & (d < dim_k)[None, :]
        x = tl.load(src + d[None, :] * sk_d, mask=m)
        tl.store(dst + d[None, :] * skc_d, x.to(kc_ptr.dtype.element_ty), mask=m)

    dv = tl.arange(0, BLOCK_DV)
    src = v_ptr + t[:, None] * sv_t + h[:, None] * sv_h
    dst = vc_ptr + blk[:, None] * svc_b + off[:, None] * svc_s + h[:, None] * svc_h
    for d0 in range(0, dim_v, BLOCK_DV):
        d = d0 + dv
        m = rm[:, None] & (d < dim_v)[None, :]
        x = tl.load(src + d[None, :] * sv_d, mask=m)
        tl.store(dst + d[None, :] * svc_d, x.to(vc_ptr.dtype.element_ty), mask=m)


@triton.jit
def _merge_kernel(
    oa_ptr, ob_ptr, la_ptr, lb_ptr, out_ptr, lse_ptr,
    rows, num_heads, dim,
    soa_t, soa_h, soa_d, sob_t, sob_h, sob_d,
    sla_t, sla_h, slb_t, slb_h,
    so_t, so_h,
    ACC: tl.constexpr, RNE_BF16: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Rows r = t * H + h of [BLOCK_R]: lse = logaddexp(lse_a, lse_b), out = wa*out_a + wb*out_b
    with a side of weight 0 (lse -inf, or underflow) contributing exactly nothing."""
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    rm = r < rows
    t = r // num_heads
    h = r % num_heads
    neg_inf = float("-inf")
    la = tl.load(la_ptr + t * sla_t + h * sla_h, mask=rm, other=neg_inf).to(ACC)
    lb = tl.load(lb_ptr + t * slb_t + h * slb_h, mask=rm, other=neg_inf).to(ACC)
    mx = tl.maximum(la, lb)
    mx = tl.where(mx == neg_inf, 0.0, mx)  # both empty: exp(-inf - 0) = 0, never -inf - -inf
    wa = tl.exp(la - mx)
    wb = tl.exp(lb - mx)
    total = wa + wb  # in [1, 2] unless both sides are empty (then 0)
    nonempty = total > 0
    lse = tl.where(nonempty, mx + tl.log(tl.where(nonempty, total, 1.0)), neg_inf)
    inv = tl.where(nonempty, 1.0 / tl.where(nonempty, total, 1.0), 0.0)
    wa = wa * inv
    wb = wb * inv
    tl.store(lse_ptr + r, lse.to(lse_ptr.dtype.element_ty), mask=rm)

    use_a = (wa > 0)[:, None]
    use_b = (wb > 0)[:, None]
    wa2 = wa[:, None]
    wb2 = wb[:, None]
    dd = tl.arange(0, BLOCK_D)
    for d0 in range(0, dim, BLOCK_D):
        d = d0 + dd
        m = rm[:, None] & (d < dim)[None, :]
        # a side of weight 0 is not even read: its out may hold NaN/Inf garbage
        oa = tl.load(
            oa_ptr + t[:, None] * soa_t + h[:, None] * soa_h + d[None, :] * soa_d, mask=m & use_a, other=0.0
        ).to(ACC)
        ob = tl.load(
            ob_ptr + t[:, None] * sob_t + h[:, None] * sob_h + d[None, :] * sob_d, mask=m & use_b, other=0.0
        ).to(ACC)
        o = tl.where(use_a, wa2 * oa, 0.0) + tl.where(use_b, wb2 * ob, 0.0)
        tl.store(
            out_ptr + t[:, None] * so_t + h[:, None] * so_h + d[None, :],
            cast_out(o, out_ptr.dtype.element_ty, RNE_BF16),
            mask=m,
        )


# ----------------------------------------------------------------------------- launchers


def _scatter(op: str, key, value, k_cache, v_cache, slot_mapping, tuning: Tuning) -> None:
    """key/value [T, H, D*], caches [NB, BS, H, D*] (any strides)."""
    tokens, heads = key.shape[0], key.shape[1]
    if tokens == 0 or heads == 0:
        return
    nb, bs = k_cache.shape[0], k_cache.shape[1]
    dk, dv = key.shape[2], value.shape[2]
    block, launch = _block(tuning)
    bdk, bdv = min(_pow2(dk), block), min(_pow2(dv), block)
    bh = max(1, min(_pow2(heads), block // max(bdk, bdv)))
    bt = max(1, min(_pow2(tokens), block // (bh * max(bdk, bdv))))  # 1 unless all heads fit with room to spare
    grid = (triton.cdiv(tokens, bt), triton.cdiv(heads, bh))
    _scatter_kv_kernel[grid](
        slot_mapping, key, value, k_cache, v_cache,
        tokens, heads, dk, dv, bs, nb * bs,
        slot_mapping.stride(0),
        *key.stride(), *value.stride(),
        *k_cache.stride(), *v_cache.stride(),
        BLOCK_T=bt, BLOCK_H=bh, BLOCK_DK=bdk, BLOCK_DV=bdv, **launch,
    )  # fmt: skip


def _check_slots(op: str, slot_mapping, tokens: int) -> None:
    """dtype and shape only: the values are hetero.spec.validate's (validation on); the kernel
    skips any slot outside [0, NB*BS) instead of writing out of bounds."""
    check_tensor(op, "slot_mapping", slot_mapping, shape=(tokens,), dtypes=(torch.int64,))


def write_kv(key, value, k_cache, v_cache, slot_mapping, *, tuning: Tuning) -> None:
    op = "write_kv"
    t, _ = check_kv_write(op, key, value, k_cache, v_cache)
    check_same_device(op, key=key, value=value, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    _check_slots(op, slot_mapping, t)
    _scatter(op, key, value, k_cache, v_cache, slot_mapping, tuning)


def write_mla_kv(kv_c, k_pe, ckv_cache, kpe_cache, slot_mapping, *, tuning: Tuning) -> None:
    op = "write_mla_kv"
    check_tensor(op, "kv_c", kv_c, ndim=2, dtypes=FLOAT_DTYPES)
    t, lkv = kv_c.shape
    dt = (kv_c.dtype,)
    check_tensor(op, "k_pe", k_pe, shape=(t, None), dtypes=dt)
    check_tensor(op, "ckv_cache", ckv_cache, shape=(None, None, lkv), dtypes=dt)
    nb, bs = ckv_cache.shape[:2]
    check_tensor(op, "kpe_cache", kpe_cache, shape=(nb, bs, k_pe.shape[1]), dtypes=dt)
    check_same_device(op, kv_c=kv_c, k_pe=k_pe, ckv_cache=ckv_cache, kpe_cache=kpe_cache, slot_mapping=slot_mapping)
    _check_slots(op, slot_mapping, t)
    # one latent "head": the [T, 1, *] / [NB, BS, 1, *] views share the storage (writes land in place)
    _scatter(
        op, kv_c.unsqueeze(1), k_pe.unsqueeze(1), ckv_cache.unsqueeze(2), kpe_cache.unsqueeze(2), slot_mapping, tuning
    )


def write_index_k(k, index_cache, slot_mapping, *, index_scale=None, tuning: Tuning) -> None:
    """Plain format: write_kv's scatter with one head and no value. fp8 format: one program per tile
    of tokens quantizes each 128-channel group (``_indexer_kernels.index_k_fp8_kernel``)."""
    op = "write_index_k"
    t, _ = check_index_k_write(op, k, index_cache, slot_mapping, index_scale)  # the slots' values: validate's
    if index_scale is None:
        k3, c4 = k.unsqueeze(1), index_cache.unsqueeze(2)
        _scatter(op, k3, k3[:, :, :0], c4, c4[..., :0], slot_mapping, tuning)
        return
    if t == 0:
        return
    nb, bs, d = index_cache.shape
    cache = index_cache.view(torch.uint8)
    block, launch = _block(tuning)
    bt = max(1, min(_pow2(t), block // INDEX_SCALE_GROUP))
    ik.index_k_fp8_kernel[(triton.cdiv(t, bt),)](
        k, slot_mapping, cache, index_scale, t, nb * bs, bs, d // INDEX_SCALE_GROUP,
        *k.stride(), slot_mapping.stride(0), *cache.stride(), *index_scale.stride(), BLOCK_T=bt, **launch,
    )  # fmt: skip


def merge_attention(out_a, lse_a, out_b, lse_b, *, tuning: Tuning) -> tuple[torch.Tensor, torch.Tensor]:
    op = "merge_attention"
    check_tensor(op, "out_a", out_a, ndim=3, dtypes=FLOAT_DTYPES)
    check_tensor(op, "out_b", out_b, shape=tuple(out_a.shape), dtypes=(out_a.dtype,))
    check_tensor(op, "lse_a", lse_a, shape=tuple(out_a.shape[:2]), dtypes=_STAT_DTYPES)
    check_tensor(op, "lse_b", lse_b, shape=tuple(out_a.shape[:2]), dtypes=_STAT_DTYPES)
    check_same_device(op, out_a=out_a, lse_a=lse_a, out_b=out_b, lse_b=lse_b)
    t, h, dv = out_a.shape
    out = torch.empty((t, h, dv), dtype=out_a.dtype, device=out_a.device)
    lse = torch.empty((t, h), dtype=torch.float32, device=out_a.device)
    rows = t * h
    if rows == 0:
        return out, lse
    f64 = torch.float64 in (out_a.dtype, lse_a.dtype, lse_b.dtype)
    block, launch = _block(tuning)
    bd = min(_pow2(dv), block)
    br = max(1, min(_pow2(rows), block // bd))
    _merge_kernel[(triton.cdiv(rows, br),)](
        out_a, out_b, lse_a, lse_b, out, lse,
        rows, h, dv,
        *out_a.stride(), *out_b.stride(),
        *lse_a.stride(), *lse_b.stride(),
        out.stride(0), out.stride(1),
        ACC=tl.float64 if f64 else tl.float32, RNE_BF16=rne_bf16(out.dtype, tuning), BLOCK_R=br, BLOCK_D=bd, **launch,
    )  # fmt: skip
    return out, lse
