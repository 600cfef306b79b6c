"""``hetero quantize``'s W4A16 schemes, written by the ``compressed-tensors`` package itself, and the float copy
(the oracle) of any W4A16 checkpoint the engine loads (compressed-tensors ``pack-quantized``, GPTQ, AWQ).

Writing: compressed-tensors' preset scheme (``W4A16`` or ``W4A16_ASYM``) with the group size asked, its
min-max ``calculate_qparams`` per group of each weight and its ``pack-quantized`` compressor, which
quantizes, packs (``weight_packed`` int32 [N, K/8], ``weight_zero_point`` packed along N when asymmetric)
and records ``weight_shape``; the config is its ``QuantizationConfig``. compressed-tensors needs whole
groups: a weight whose K is not a multiple of the group size is refused by name.

Reading back: each quantized module's parts converted to the spec's canonical form by the engine's own
converters (``hetero.engine.quant.int4``) and dequantized by the spec's formula, ``float32(q - zp) * scale``.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import torch

from hetero.errors import UsageError

__all__ = ["W4A16_SCHEMES", "quantize_int4", "int4_config", "int4_dequantizer"]

#: scheme -> (group size, symmetric)
W4A16_SCHEMES = {
    "w4a16-g128": (128, True),
    "w4a16-g32": (32, True),
    "w4a16-g128-asym": (128, False),
    "w4a16-g32-asym": (32, False),
}


def _ct_scheme(scheme: str):
    from compressed_tensors.config import CompressionFormat
    from compressed_tensors.quantization import preset_name_to_scheme

    group, symmetric = W4A16_SCHEMES[scheme]
    ct = preset_name_to_scheme("W4A16" if symmetric else "W4A16_ASYM", ["Linear"])
    ct.weights.group_size = group
    ct.format = CompressionFormat.pack_quantized.value
    return ct


def quantize_int4(name: str, tensor: torch.Tensor, scheme: str, scale_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The compressed-tensors tensors of Linear weight ``name`` under ``scheme`` (its module's
    ``weight_packed``, ``weight_scale``, ``weight_shape`` and, asymmetric, ``weight_zero_point``)."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization.utils import calculate_qparams

    ct = _ct_scheme(scheme)
    g, k = ct.weights.group_size, tensor.shape[1]
    if k % g:
        raise UsageError(
            f"quantize: {name} has {k} input columns, not a multiple of the group size {g} "
            f"(compressed-tensors quantizes whole groups; try {', '.join(s for s in W4A16_SCHEMES if s != scheme)})"
        )
    groups = tensor.to(torch.float32).unflatten(-1, (k // g, g))
    scale, zero_point = calculate_qparams(groups.amin(-1), groups.amax(-1), ct.weights)
    state = {"weight": tensor.to(torch.float32), "weight_scale": scale.to(scale_dtype), "weight_zero_point": zero_point}
    compressor = BaseCompressor.get_value_from_registry(ct.format)
    base = name.removesuffix(".weight")
    return {f"{base}.{part}": value for part, value in compressor.compress(state, ct).items()}


def int4_config(scheme: str, kept: list[str]) -> dict[str, Any]:
    """The ``quantization_config`` of a ``scheme`` checkpoint: compressed-tensors' own QuantizationConfig."""
    from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus

    ct = _ct_scheme(scheme)
    config = QuantizationConfig(
        config_groups={"group_0": ct},
        format=ct.format,
        quantization_status=QuantizationStatus.COMPRESSED,
        ignore=kept,
    )
    return config.model_dump(mode="json")


def int4_dequantizer(src: Path, qc: dict[str, Any] | None, dtype: torch.dtype) -> Callable | None:
    """For a W4A16 checkpoint (``qc``, its quantization_config): the tensor converter of the dequantizing
    rewrite (``convert(name, tensor, seen) -> {name: tensor}``); None for any other checkpoint."""
    from safetensors import safe_open

    from hetero.engine.loader import checkpoint_files
    from hetero.engine.quant.config import quant_config_of
    from hetero.engine.quant.int4 import Int4Scheme

    if not qc:
        return None
    scheme = getattr(quant_config_of(SimpleNamespace(quantization_config=qc)), "scheme", None)
    if not isinstance(scheme, Int4Scheme):
        return None
    names = scheme.names
    located = {}
    for path in checkpoint_files(src, "the quantized checkpoint"):
        with safe_open(str(path), framework="pt") as f:
            located.update({n: path for n in f.keys()})

    def get(name: str) -> torch.Tensor:
        with safe_open(str(located[name]), framework="pt") as f:
            return f.get_tensor(name)

    def convert(name: str, tensor: torch.Tensor, seen: dict[str, list[str]]) -> dict[str, torch.Tensor]:
        base, _, suffix = name.rpartition(".")
        if suffix not in names.values() or f"{base}.{names['weight']}" not in located:
            return {name: tensor}
        if suffix != names["weight"]:
            return {}
        seen["converted"].append(base)
        return {f"{base}.weight": _dequantized(scheme, base, tensor, get, dtype)}

    return convert


def _dequantized(scheme, base: str, packed: torch.Tensor, get: Callable, dtype: torch.dtype) -> torch.Tensor:
    from hetero.engine.quant._int4math import dequantize_int4

    names = scheme.names
    scales = get(f"{base}.{names['scale']}")
    if scheme.layout == "compressed-tensors":
        n, k = get(f"{base}.{names['shape']}").tolist()
    elif scheme.layout == "awq":
        n, k = scales.shape[1], packed.shape[0]
    else:
        n, k = scales.shape[1], packed.shape[0] * 8
    parts = {"weight": packed, "scale": scales}
    if "zero" in names:
        parts["zero"] = get(f"{base}.{names['zero']}")
    canon = {part: scheme.canonical(part, t, n, k) for part, t in parts.items()}
    g_idx = get(f"{base}.{names['g_idx']}") if "g_idx" in names else None
    return dequantize_int4(
        canon["weight"], canon["scale"], canon.get("zero"), k, group_size=scheme.group(k), g_idx=g_idx, dtype=dtype
    )
