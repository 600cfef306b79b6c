"""Triton kv_compress (spec 1.8, DeepSeek-V4's KV compressor).

Semantics: ``hetero.spec.compressed.kv_compress``; the kernels are in ``_compress_kernels``. This
module runs the cheap checks (no host read of an index tensor) and plans the call once, on the
device and without a host sync:

* the entry list: each sequence with a slot emits ``seq_lens // m - start // m`` entries, at most
  ``n // m + 1`` for n new rows, so ``T // m + B`` programs cover any batch. Sequence and window of
  program e come from a cumulative count and a ``searchsorted`` (a program past the last entry
  exits at once), made by a few torch ops on the device;
* launch 1, ``compress_entry_kernel``: one program per entry (grid ``T // m + B``), the whole entry
  in registers, slots in tiles of ``BLOCK_J`` with ``BLOCK_J * ceil(D / 2) <= TILE``;
* launch 2, ``compress_state_kernel``: (tile of rows, tile of C*D), ``BLOCK`` elements of the
  "elementwise" entry per program: the ring update, after every read of launch 1 (the same stream
  orders them).

T = 0, a batch that closes no window, and padding sequences (slot -1) need no special case.
Tuning entry "kv_compress": ``TILE``, ``num_warps`` (defaults below).
"""

from __future__ import annotations

import torch

from hetero.kernels import _compress_kernels as kern
from hetero.kernels._meta import row_positions
from hetero.kernels._rounding import rne_bf16
from hetero.kernels._triton import triton_modules
from hetero.kernels.tuning import Tuning
from hetero.spec.checks import check_kv_compress
from hetero.spec.types import AttentionMeta

triton, tl = triton_modules()

__all__ = ["kv_compress", "plan_entries"]

#: Portable defaults: a [BLOCK_J, D/2] tile of 2048 elements per operand (D = 512: 8 slots, CSA's whole window).
_TILES = {"TILE": 2048, "num_warps": 4}
_TILES_INTERPRETED = {"TILE": 1 << 16}


def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def plan_entries(meta: AttentionMeta, state_slots: torch.Tensor, ratio: int, tokens: int) -> tuple[torch.Tensor, ...]:
    """(sequence, window) int64 [T // m + B] of every entry the call emits, window -1 past the last
    one: device-side torch ops, no host sync."""
    cu = meta.query_start_loc.to(torch.int64)
    lens = meta.seq_lens.to(torch.int64)
    batch = lens.shape[0]
    start = lens - (cu[1:] - cu[:-1])
    first = torch.div(start, ratio, rounding_mode="floor")
    count = torch.where(state_slots >= 0, (torch.div(lens, ratio, rounding_mode="floor") - first).clamp(min=0), 0)
    ends = torch.cumsum(count, 0)
    e = torch.arange(tokens // ratio + batch, device=lens.device)
    seq = torch.searchsorted(ends, e, right=True)
    past = seq >= batch
    seq = seq.clamp(max=batch - 1)
    w = first[seq] + e - (ends[seq] - count[seq])
    return seq, torch.where(past, -1, w)


def kv_compress(
    kv, gate, position_bias, norm_weight, cos_sin_cache, comp_cache, kv_state, gate_state, meta, state_slots,
    *, ratio, overlap, eps, tuning: Tuning,
) -> None:  # fmt: skip
    """Pool the windows that close in this call into comp_cache, then update the state ring."""
    dims = check_kv_compress(
        "kv_compress", kv, gate, position_bias, norm_weight, cos_sin_cache, comp_cache, kv_state, gate_state, meta,
        state_slots, ratio, overlap, eps,
    )  # fmt: skip
    t, batch = dims.tokens, meta.num_seqs
    if t == 0 or batch == 0 or dims.slots == 0:  # no row to read, or no slot to read or write (every slot is -1)
        return
    d, width = dims.dim, dims.halves * dims.dim
    seq, w = plan_entries(meta, state_slots, ratio, t)
    acc = torch.float64 if kv.dtype == torch.float64 else torch.float32
    params = {**_TILES, **(_TILES_INTERPRETED if tuning.interpreted else {}), **tuning("kv_compress")}
    meta_p, launch = Tuning.launch_options(params)
    half_p = _pow2((d + 1) // 2)
    block_j = max(1, min(_pow2(dims.ring), int(meta_p["TILE"]) // half_p))
    table = meta.block_table
    if dims.blocks and table.shape[1] and dims.positions:  # else no entry can be written (the index checks say so)
        kern.compress_entry_kernel[(w.shape[0],)](
            kv, gate, kv_state, gate_state, position_bias, norm_weight, cos_sin_cache, comp_cache, table,
            meta.query_start_loc, meta.seq_lens, state_slots, seq, w,
            t, batch, dims.slots, dims.blocks, dims.block_size, max(dims.positions, 1), table.shape[1], ratio,
            dims.ring, dims.ring, d, dims.rot // 2, float(eps),
            *kv.stride(), *gate.stride(), *kv_state.stride(), *gate_state.stride(), *position_bias.stride(),
            norm_weight.stride(0), *cos_sin_cache.stride(), *comp_cache.stride(), *table.stride(),
            OVERLAP=bool(overlap), ACC=tl.float64 if acc == torch.float64 else tl.float32,
            RNE_BF16=rne_bf16(comp_cache.dtype, tuning), HALF_P=half_p, BLOCK_J=block_j, **launch,
        )  # fmt: skip
    rows, pos = row_positions(meta, t)
    el_meta, el_launch = Tuning.launch_options(tuning("elementwise"))
    block = int(el_meta.get("BLOCK", 1024))
    block_c = min(_pow2(width), block)
    block_t = max(1, block // block_c)
    kern.compress_state_kernel[(triton.cdiv(t, block_t), triton.cdiv(width, block_c))](
        kv, gate, kv_state, gate_state, rows, pos, meta.seq_lens, state_slots,
        t, dims.slots, dims.ring, width,
        *kv.stride(), *gate.stride(), *kv_state.stride(), *gate_state.stride(),
        BLOCK_T=block_t, BLOCK_C=block_c, **el_launch,
    )  # fmt: skip
