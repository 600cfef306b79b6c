"""INT4 weight-only (W4A16) layers: packed int4 weights with per-group scales and optional zero points.

Three checkpoint layouts (``Int4Scheme.layout``; ``_int4math`` says how each stores its nibbles):
compressed-tensors ``pack-quantized`` (``weight_packed``, ``weight_scale``, ``weight_zero_point`` when
asymmetric, ``weight_shape``), GPTQ (``qweight``, ``qzeros``, ``scales``, ``g_idx``; v1 zero points
stored minus one, ``gptq_v2`` not) and AWQ GEMM (``qweight``, ``qzeros``, ``scales``, interleaved
nibbles). A layer's parameters keep the checkpoint's names but hold the spec's canonical form,
converted from each checkpoint tensor as it loads (before any tensor-parallel cut): uint8
``[N, ceil(K/2)]`` codes, float32 scales and uint8 zero points ``[N, ceil(K/g)]``. ``apply`` is
``gemm(x, w, b_scale=, b_zero_point=, group_size=)``; the activations stay in the model dtype.

Tensor parallel: column-parallel layers cut rows with their scales; row-parallel ones cut K, which
must fall on a group boundary (and a byte), else an UnsupportedQuantization naming the layer, the
group size and the width. Per-channel scales (one group per row) are not cut along K.

GPTQ act-order (``desc_act``: ``g_idx`` permutes the columns among the groups): after loading, the
columns are sorted by group (``run_weight``, a copy) and ``apply`` gathers the activation columns in
the same order, so groups are contiguous as the op needs. A permutation cannot be cut between ranks:
a row-parallel layer under tensor parallelism is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from hetero.engine.quant._int4math import (
    awq_weight,
    awq_zeros,
    ct_weight,
    ct_zero_point,
    gptq_weight,
    gptq_zeros,
    transposed_scales,
)
from hetero.engine.quant._select import ScaledQuantConfig
from hetero.engine.quant.config import UnsupportedQuantization

__all__ = ["Int4Scheme", "Int4QuantConfig", "LAYOUTS", "pack_quantized_config"]

#: checkpoint layout -> the suffix of each part: weight, scale, zero point (None: never stored), extra
LAYOUTS = {
    "compressed-tensors": ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape"),
    "gptq": ("qweight", "scales", "qzeros", "g_idx"),
    "gptq_v2": ("qweight", "scales", "qzeros", "g_idx"),
    "awq": ("qweight", "scales", "qzeros", None),
}


@dataclass(frozen=True)
class Int4Scheme:
    """A W4A16 checkpoint's layers: ``layout`` (a key of LAYOUTS), ``group_size`` (None: one group per row,
    per channel), ``symmetric`` (zero point 8), ``desc_act`` (GPTQ act-order: g_idx may permute columns)."""

    layout: str
    group_size: int | None
    symmetric: bool
    desc_act: bool = False

    dtype: ClassVar[torch.dtype] = torch.uint8
    act_quant: ClassVar[None] = None  # weight-only: the activations stay in float
    scale_fmt: ClassVar[str] = "float"

    @property
    def names(self) -> dict[str, str]:
        """Part -> checkpoint suffix: "weight", "scale", and "zero" / "shape" / "g_idx" where stored."""
        weight, scale, zero, extra = LAYOUTS[self.layout]
        names = {"weight": weight, "scale": scale}
        if self.layout != "compressed-tensors" or not self.symmetric:
            names["zero"] = zero
        if extra is not None:
            names["shape" if extra == "weight_shape" else "g_idx"] = extra
        return names

    def group(self, k: int) -> int:
        """The group size of a weight of ``k`` columns (``k`` itself per channel)."""
        return self.group_size or k

    def canonical(self, part: str, tensor: torch.Tensor, n: int, k: int) -> torch.Tensor:
        """Checkpoint ``tensor`` of ``part`` of one [n, k] weight in the canonical form."""
        groups, layout = -(-k // self.group(k)), self.layout
        if part == "weight":
            convert = {"compressed-tensors": ct_weight, "awq": awq_weight}.get(layout, gptq_weight)
            return convert(tensor, n, k)
        if part == "scale":
            if layout != "compressed-tensors":
                return transposed_scales(tensor, n, groups)
            if tuple(tensor.shape) != (n, groups):
                raise ValueError(f"weight_scale: expected shape {[n, groups]}, the checkpoint has {list(tensor.shape)}")
            return tensor
        if layout == "compressed-tensors":
            return ct_zero_point(tensor, n, groups)
        if layout == "awq":
            return awq_zeros(tensor, n, groups)
        return gptq_zeros(tensor, n, groups, offset=1 if layout == "gptq" else 0)

    def weights_only(self) -> "Int4Scheme":
        """Already weight-only."""
        return self

    def describe(self) -> str:
        groups = f"groups of {self.group_size}" if self.group_size else "per channel"
        zero = "symmetric" if self.symmetric else "zero points"
        order = ", act-order" if self.desc_act else ""
        return f"int4 weights ({self.layout}, {groups}, {zero}{order}), activations float (W4A16)"


def _linear(scheme: Int4Scheme):
    from hetero.engine.quant.int4_linear import Int4LinearMethod

    return Int4LinearMethod(scheme)


def _moe(scheme: Int4Scheme):
    from hetero.engine.quant.int4_moe import Int4MoEMethod

    return Int4MoEMethod(scheme)


@dataclass(frozen=True)
class Int4QuantConfig(ScaledQuantConfig):
    """Every Linear and FusedMoE on int4 weights, except the skip list and the layers always in float."""

    linear_cls: ClassVar = _linear
    moe_cls: ClassVar = _moe


def _refuse(fmt: str, why: str) -> UnsupportedQuantization:
    return UnsupportedQuantization(f"quantization_config ({fmt}): {why}")


def pack_quantized_config(group: dict[str, Any], qc: dict[str, Any]) -> Int4QuantConfig:
    """compressed-tensors ``pack-quantized`` W4A16 (one config group targeting Linear): 4-bit int weights,
    symmetric or asymmetric, in groups (any size; llm-compressor writes 32, 64, 128) or per channel, no
    activation quantization. Anything else is refused by name."""
    fmt = "compressed-tensors pack-quantized"
    if "Linear" not in (group.get("targets") or ()):
        raise _refuse(fmt, f"targets {group.get('targets')!r} (the group must target Linear)")
    if group.get("input_activations") or group.get("output_activations"):
        raise _refuse(fmt, "activation quantization (W4A8) is not supported; only weight-only W4A16")
    w = group.get("weights") or {}
    if w.get("num_bits") != 4 or w.get("type") != "int":
        raise _refuse(fmt, f"weights of {w.get('num_bits')} bits, type {w.get('type')!r} (only 4-bit int)")
    if w.get("dynamic"):
        raise _refuse(fmt, "dynamic weight quantization is not supported")
    if w.get("actorder") not in (None, False, "static", "weight"):
        raise _refuse(fmt, f"actorder {w.get('actorder')!r} (weight_g_idx) is not supported (None or 'weight')")
    strategy, size = w.get("strategy"), w.get("group_size")
    if strategy == "group" and isinstance(size, int) and size > 0:
        group_size = size
    elif strategy == "channel":
        group_size = None
    else:
        raise _refuse(fmt, f"weight strategy {strategy!r} (group_size {size!r}): groups or per channel only")
    scheme = Int4Scheme("compressed-tensors", group_size, bool(w.get("symmetric", True)))
    return Int4QuantConfig(name=fmt, scheme=scheme, skip=tuple(qc.get("ignore") or ()))
