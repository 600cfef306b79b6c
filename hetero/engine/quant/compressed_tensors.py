"""``quant_method: "compressed-tensors"`` (llm-compressor): 8-bit weights with dynamic activations, and W4A16.

Supported, for one config group targeting ``Linear``:

- ``float-quantized``: FP8_DYNAMIC (e4m3 weights with per-channel ``weight_scale`` [N, 1],
  per-token dynamic activations) and FP8_BLOCK (128x128 ``weight_scale``, 1x128 dynamic activations);
- ``int-quantized``: W8A8 int8, per-channel symmetric weights, per-token symmetric dynamic activations;
- either without ``input_activations`` (weights only, W8A16);
- ``pack-quantized``: W4A16, 4-bit int weights in groups or per channel, with or without zero points
  (``int4.pack_quantized_config``).

Refused by name (UnsupportedQuantization): static activation scales, asymmetric 8-bit weights or
activations (``scaled_gemm`` has no zero point), per-tensor and group-wise 8-bit weight scales,
several config groups. ``ignore`` lists modules left in float
(names, suffixes or ``re:`` regexes).
"""

from __future__ import annotations

from typing import Any

import torch

from hetero.engine.quant._qmath import BLOCK
from hetero.engine.quant._select import ScaledQuantConfig
from hetero.engine.quant.config import UnsupportedQuantization
from hetero.engine.quant.scaled import Scheme

__all__ = ["compressed_tensors_config"]

_FORMATS = {"float-quantized": ("float", torch.float8_e4m3fn), "int-quantized": ("int", torch.int8)}


def _refuse(why: str) -> UnsupportedQuantization:
    return UnsupportedQuantization(f"quantization_config (compressed-tensors): {why}")


def _weight_form(w: dict[str, Any], kind: str) -> str:
    if w.get("num_bits") != 8 or w.get("type") != kind:
        raise _refuse(f"weights of {w.get('num_bits')} bits, type {w.get('type')!r} (8-bit {kind} for this format)")
    if not w.get("symmetric", True) or w.get("dynamic"):
        raise _refuse("asymmetric or dynamic weight quantization is not supported")
    strategy = w.get("strategy")
    if strategy == "channel":
        return "channel"
    if strategy == "block" and list(w.get("block_structure") or ()) == [BLOCK, BLOCK]:
        return "block"
    raise _refuse(
        f"weight strategy {strategy!r} (block_structure {w.get('block_structure')}): only per-channel "
        f"and {BLOCK}x{BLOCK} block weights are supported"
    )


def _act_quant(a: dict[str, Any] | None, kind: str) -> str | None:
    if not a:
        return None
    if not a.get("dynamic"):
        raise _refuse("static activation scales (input_scale) are not supported; only dynamic activations")
    if a.get("num_bits") != 8 or a.get("type") != kind:
        raise _refuse(f"activations of {a.get('num_bits')} bits, type {a.get('type')!r} (8-bit {kind} for this format)")
    if not a.get("symmetric", True):
        raise _refuse("asymmetric activations are not supported (scaled_gemm takes no zero point)")
    strategy = a.get("strategy")
    if strategy == "token":
        return "token"
    if strategy == "group" and a.get("group_size") == BLOCK:
        return "group128"
    raise _refuse(
        f"activation strategy {strategy!r} (group_size {a.get('group_size')}): per token or groups of {BLOCK}"
    )


def compressed_tensors_config(qc: dict[str, Any]) -> ScaledQuantConfig:
    """The QuantConfig of a compressed-tensors 8-bit checkpoint (see the module docstring)."""
    fmt = qc.get("format")
    groups = qc.get("config_groups") or {}
    if len(groups) != 1:
        raise _refuse(f"{len(groups)} config groups (exactly one is supported)")
    group = next(iter(groups.values()))
    fmt = group.get("format") or fmt
    if fmt == "pack-quantized":
        from hetero.engine.quant.int4 import pack_quantized_config

        return pack_quantized_config(group, qc)
    if fmt not in _FORMATS:
        raise _refuse(f"format {fmt!r} is not supported (supported: {', '.join(_FORMATS)}, pack-quantized)")
    if "Linear" not in (group.get("targets") or ()):
        raise _refuse(f"targets {group.get('targets')!r} (the group must target Linear)")
    kind, dtype = _FORMATS[fmt]
    form = _weight_form(group.get("weights") or {}, kind)
    scheme = Scheme(dtype, form, "weight_scale", _act_quant(group.get("input_activations"), kind))
    return ScaledQuantConfig(name=f"compressed-tensors {fmt}", scheme=scheme, skip=tuple(qc.get("ignore") or ()))
