"""Packed int4 weights: the spec's canonical layout and the checkpoint layouts that convert to it.

Canonical (``hetero.spec.gemm``): codes ``q[n, k]`` in [0, 15] packed two a byte along K, uint8
``[..., N, ceil(K/2)]``, the even column in the low nibble; float32 scales and uint8 zero points
``[..., N, ceil(K/g)]`` (no zero point: 8); ``w = float32(q - zp) * scale``.

The checkpoint layouts, each one int32 word = 8 nibbles, nibble ``i`` at bits ``4i`` (so on a
little-endian host byte ``b`` holds nibbles ``2b`` (low) and ``2b + 1`` (high)):

- compressed-tensors ``pack-quantized``: ``weight_packed`` [N, ceil(K/8)] along K in order (viewed as
  bytes it is already canonical), codes stored signed (``q - 8``, packed with +8, i.e. the same
  nibbles); ``weight_zero_point`` [ceil(N/8), G] packed along N the same way, signed likewise;
- GPTQ: ``qweight`` [K/8, N] packed along K in order; ``qzeros`` [G, N/8] along N in order, stored
  as ``zp - 1`` by the original (v1) format and as ``zp`` by ``checkpoint_format: gptq_v2``; ``scales``
  [G, N]; ``g_idx`` [K], the group of each input column;
- AWQ (GEMM): ``qweight`` [K, N/8] and ``qzeros`` [G, N/8] along N, nibble ``i`` of a word holding
  column ``AWQ_ORDER[i]`` of its eight; ``scales`` [G, N]; no zero point offset.
"""

from __future__ import annotations

import sys

import torch

__all__ = [
    "AWQ_ORDER",
    "pack_int4",
    "unpack_int4",
    "dequantize_int4",
    "group_index",
    "ct_weight",
    "ct_zero_point",
    "gptq_weight",
    "gptq_zeros",
    "awq_weight",
    "awq_zeros",
    "transposed_scales",
]

#: AWQ's GEMM packing: nibble i of a word holds column AWQ_ORDER[i] of the word's eight columns
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_AWQ_INVERSE = tuple(AWQ_ORDER.index(j) for j in range(8))


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Codes uint8 [..., K] in [0, 15] -> canonical uint8 [..., ceil(K/2)] (even column in the low nibble)."""
    if codes.dtype != torch.uint8:
        raise ValueError(f"int4 codes are uint8, got {codes.dtype}")
    if codes.shape[-1] % 2:
        codes = torch.cat([codes, codes.new_zeros(*codes.shape[:-1], 1)], dim=-1)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()


def unpack_int4(packed: torch.Tensor, k: int) -> torch.Tensor:
    """Canonical uint8 [..., ceil(k/2)] -> codes uint8 [..., k]."""
    if packed.dtype != torch.uint8 or packed.shape[-1] != -(-k // 2):
        raise ValueError(
            f"expected packed uint8 [..., {-(-k // 2)}] for {k} columns, got {packed.dtype} {list(packed.shape)}"
        )
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)[..., :k]


def group_index(k: int, group_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The group of each of ``k`` columns in the canonical layout: ``arange(k) // group_size`` (int64)."""
    return torch.arange(k, device=device) // group_size


def dequantize_int4(
    packed: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None,
    k: int,
    *,
    group_size: int | None = None,
    g_idx: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The float [..., N, k] a canonical packed weight means: ``float32(q - zp) * scale`` (one rounding), then
    ``dtype``. Column ``c``'s scale is group ``g_idx[c]`` (default ``c // group_size``) of its row."""
    groups = g_idx.long() if g_idx is not None else group_index(k, group_size, packed.device)
    q = unpack_int4(packed, k).to(torch.float32)
    zp = 8.0 if zero_point is None else zero_point.to(torch.float32).index_select(-1, groups)
    return ((q - zp) * scale.to(torch.float32).index_select(-1, groups)).to(dtype)


def _nibbles(words: torch.Tensor) -> torch.Tensor:
    """int32 [..., W] -> uint8 [..., 8W]: each word's nibbles in bit order (nibble i = bits 4i..4i+3)."""
    if words.dtype != torch.int32:
        raise ValueError(f"packed int4 checkpoint tensors are int32, got {words.dtype}")
    if sys.byteorder != "little":
        raise ValueError("reading packed int4 checkpoints needs a little-endian host")
    b = words.contiguous().view(torch.uint8)
    return torch.stack([b & 0xF, b >> 4], dim=-1).flatten(-2)


def _check(tensor: torch.Tensor, shape: tuple[int, ...], what: str) -> None:
    if tuple(tensor.shape) != shape:
        raise ValueError(f"{what}: expected shape {list(shape)}, the checkpoint has {list(tensor.shape)}")


def ct_weight(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """compressed-tensors ``weight_packed`` int32 [n, ceil(k/8)] -> canonical [n, ceil(k/2)] (a byte view)."""
    _check(packed, (n, -(-k // 8)), "weight_packed (int32, 8 codes a word along K)")
    if sys.byteorder != "little":
        raise ValueError("reading packed int4 checkpoints needs a little-endian host")
    return packed.contiguous().view(torch.uint8)[:, : -(-k // 2)].contiguous()


def ct_zero_point(packed: torch.Tensor, n: int, groups: int) -> torch.Tensor:
    """compressed-tensors ``weight_zero_point`` int32 [ceil(n/8), groups] (packed along N) -> uint8 [n, groups]."""
    _check(packed, (-(-n // 8), groups), "weight_zero_point (int32, 8 rows a word)")
    return _nibbles(packed.T)[:, :n].T.contiguous()


def gptq_weight(qweight: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """GPTQ ``qweight`` int32 [k/8, n] (packed along K) -> canonical [n, k/2]: the transpose viewed as bytes."""
    if k % 8:
        raise ValueError(f"GPTQ packs 8 input columns a word; {k} input columns is not a multiple of 8")
    _check(qweight, (k // 8, n), "qweight (int32 [K/8, N])")
    return pack_int4(_nibbles(qweight.T))


def gptq_zeros(qzeros: torch.Tensor, n: int, groups: int, offset: int) -> torch.Tensor:
    """GPTQ ``qzeros`` int32 [groups, n/8] -> zero points uint8 [n, groups]; ``offset`` 1 for the v1 format
    (stored ``zp - 1``), 0 for gptq_v2. A v1 nibble of 15 (zero point 16) is outside [0, 15]: an error."""
    _check(qzeros, (groups, -(-n // 8)), "qzeros (int32 [groups, N/8])")
    zp = _nibbles(qzeros)[:, :n].to(torch.int16) + offset
    if int(zp.max()) > 15:
        raise ValueError("a GPTQ v1 zero point of 16 (stored nibble 15) does not fit the int4 zero points [0, 15]")
    return zp.to(torch.uint8).T.contiguous()


def awq_weight(qweight: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """AWQ ``qweight`` int32 [k, n/8] (along N, interleaved) -> canonical [n, ceil(k/2)]."""
    _check(qweight, (k, -(-n // 8)), "qweight (int32 [K, N/8])")
    return pack_int4(_awq_columns(qweight)[:, :n].T.contiguous())


def awq_zeros(qzeros: torch.Tensor, n: int, groups: int) -> torch.Tensor:
    """AWQ ``qzeros`` int32 [groups, n/8] (interleaved like qweight) -> zero points uint8 [n, groups]."""
    _check(qzeros, (groups, -(-n // 8)), "qzeros (int32 [groups, N/8])")
    return _awq_columns(qzeros)[:, :n].T.contiguous()


def _awq_columns(words: torch.Tensor) -> torch.Tensor:
    nib = _nibbles(words)
    return nib.view(*nib.shape[:-1], -1, 8)[..., list(_AWQ_INVERSE)].flatten(-2)


def transposed_scales(scales: torch.Tensor, n: int, groups: int) -> torch.Tensor:
    """GPTQ / AWQ ``scales`` [groups, n] (float16 usually) -> float32 [n, groups]."""
    _check(scales, (groups, n), "scales ([groups, N])")
    if not scales.dtype.is_floating_point:
        raise ValueError(f"scales are floating point, got {scales.dtype}")
    return scales.to(torch.float32).T.contiguous()
