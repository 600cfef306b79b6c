"""Scaled 8-bit weights (fp8 e4m3 or int8) with block or per-channel scales, and dynamic activation quantization.

One ``Scheme`` describes a format's layers; the fp8 (DeepSeek / Qwen3-FP8) and compressed-tensors
configs build theirs. A Linear holds ``weight`` [N, K] in the scheme's dtype and its float32 scale
(``weight_scale_inv`` or ``weight_scale``: [ceil(N/128), ceil(K/128)] blocks or [N, 1] channels;
bfloat16 / float16 checkpoint scales are converted on load). With activation quantization
(``act_quant`` "group128": 1x128 token groups, "token": one scale per row) ``apply`` is
``quantize_activation`` then ``scaled_gemm``; without (W8A16) the weight is dequantized once after
loading and run through ``gemm``. A FusedMoE stacks the experts' weights and scales ([E, ...]) for
``fused_moe``'s quantized mode (expert parallel: ``quantize_activation`` and ``scaled_grouped_gemm``).

Block scales follow their weight's packing and tensor-parallel cuts in block units, so every
packed shard but the last, and every rank's share, must be a multiple of 128 rows (columns);
anything else is an error naming the layer. e4m3fnuz devices (MI300) would need the e4m3fn
weights converted at load (bit pattern 0x80 -> 0, scales doubled); no backend declares its fp8
dtype yet, so the weights stay e4m3fn (``_qmath.e4m3fn_to_fnuz`` is the conversion, ready for that).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from hetero.engine.quant._qmath import BLOCK, block_grid, dequantize
from hetero.engine.quant.base import LinearMethod, MoEMethod, QuantMethod, register_weight
from hetero.engine.quant.config import UnsupportedQuantization

__all__ = ["Scheme", "ScaledLinearMethod", "ScaledMoEMethod"]

_GROUP_SIZE = {"group128": BLOCK, "token": None}


@dataclass(frozen=True)
class Scheme:
    """A scaled format's layers: weight ``dtype``; ``weight_form`` "block" (128x128) or "channel";
    the checkpoint suffix of the scale (``scale_name``); ``act_quant`` "group128", "token" or None
    (weights only, W8A16); the activation ``scale_fmt`` ("float" or "ue8m0")."""

    dtype: torch.dtype
    weight_form: str
    scale_name: str
    act_quant: str | None
    scale_fmt: str = "float"

    def weights_only(self) -> "Scheme":
        """The same weights with activations left in float (W8A16)."""
        return replace(self, act_quant=None)

    def describe(self) -> str:
        dtype = "fp8" if self.dtype.is_floating_point else "int8"
        act = {"group128": f"{dtype} 1x128 groups", "token": f"{dtype} per token", None: "float (W8A16)"}[self.act_quant]
        fmt = ", ue8m0 scales" if self.scale_fmt == "ue8m0" else ""
        form = "128x128 blocks" if self.weight_form == "block" else "per channel"
        return f"{dtype} weights ({form}), activations {act}{fmt}"


class _ScaledLoading(QuantMethod):
    """How scale parameters are cut: block scales in blocks (checked), channel scales as their rows."""

    def __init__(self, scheme: Scheme):
        self.scheme = scheme

    def _make_scale(self, layer: nn.Module, name: str, lead: tuple[int, ...], rows: int, cols: int, **attrs) -> None:
        shape = (*lead, *block_grid(rows, cols)) if self.scheme.weight_form == "block" else (*lead, rows, 1)
        register_weight(layer, name, layer.ctx.empty(*shape, dtype=torch.float32), is_scale=True, **attrs)

    def _is_block(self, param: nn.Parameter) -> bool:
        return getattr(param, "is_scale", False) and self.scheme.weight_form == "block"

    def _split_sizes(self, layer: nn.Module, dim: int) -> list[int]:
        """This rank's sizes (in weight elements) along weight dimension ``dim`` that a rank split cuts."""
        raise NotImplementedError

    def tp_part(self, layer, param, tensor, dim, index, count):
        if getattr(param, "is_scale", False) and self.scheme.weight_form == "channel" and tensor.shape[dim] == 1:
            return tensor  # [N, 1]: the input split leaves a channel's scale whole
        if not self._is_block(param):
            return super().tp_part(layer, param, tensor, dim, index, count)
        bad = [n for n in self._split_sizes(layer, dim) if n % BLOCK]
        if bad:
            raise ValueError(f"{layer.prefix}: splitting over {count} ranks leaves {bad[0]} rows/columns per rank, "
                             f"which cuts a {BLOCK}x{BLOCK} scale block (each rank's share must be a multiple of {BLOCK})")
        return super().tp_part(layer, param, tensor, dim, index, count)

    def shard_range(self, layer, param, dim, start, size):
        if not self._is_block(param):
            return start, size
        if start % BLOCK:
            raise ValueError(f"{layer.prefix}: a packed shard starts at row {start}, inside a {BLOCK}-row scale block "
                             f"(every packed part but the last must be a multiple of {BLOCK} rows)")
        return start // BLOCK, -(-size // BLOCK)

    def _bind_quant(self, layer: nn.Module) -> None:
        if self.scheme.act_quant is not None:
            layer.ctx.bind_op(layer, "_quant", "quantize_activation", quant_dtype=self.scheme.dtype)

    def _quantized(self, layer: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, scale = layer._quant(x, dtype=self.scheme.dtype, group_size=_GROUP_SIZE[self.scheme.act_quant],
                                scale_fmt=self.scheme.scale_fmt)[:2]
        return q, scale


class ScaledLinearMethod(_ScaledLoading, LinearMethod):
    """A Linear of 8-bit ``weight`` and its scale (named by the scheme)."""

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int) -> None:
        ctx, s = layer.ctx, self.scheme
        register_weight(layer, "weight", ctx.empty(out_features, in_features, dtype=s.dtype), loader=layer.load_weight,
                        shards=layer.shard_ids, output_dim=0, input_dim=1)
        self._make_scale(layer, s.scale_name, (), out_features, in_features, loader=layer.load_weight,
                         shards=layer.shard_ids, output_dim=0, input_dim=1 if s.weight_form == "block" else None)
        layer.dense = None
        if s.act_quant is None:
            ctx.bind_op(layer, "_gemm", "gemm")
        else:
            self._bind_quant(layer)
            ctx.bind_op(layer, "_scaled_gemm", "scaled_gemm", dtype=s.dtype)  # static dtype: the 8-bit operands

    def _split_sizes(self, layer, dim):
        return list(layer.out_splits) if dim == 0 else [layer.in_features]

    def _scale(self, layer: nn.Module) -> torch.Tensor:
        return getattr(layer, self.scheme.scale_name)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if self.scheme.act_quant is None:
            layer.dense = self.dense_weight(layer)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.scheme.act_quant is None:
            return layer._gemm(x, layer.dense, bias=bias)
        q, scale = self._quantized(layer, x)
        return layer._scaled_gemm(q, layer.weight, scale, self._scale(layer), bias=bias, out_dtype=x.dtype)

    def dense_weight(self, layer: nn.Module) -> torch.Tensor:
        return dequantize(layer.weight.detach(), self._scale(layer).detach(), layer.ctx.dtype)


class ScaledMoEMethod(_ScaledLoading, MoEMethod):
    """Stacked 8-bit experts: ``w13`` [E, 2I, H] (gate rows, then up rows), ``w2`` [E, H, I] and their scales
    ``w13_<scale>`` / ``w2_<scale>`` ([E, ceil(2I/128), ceil(H/128)] blocks or [E, 2I, 1] channels)."""

    def create_weights(self, layer: nn.Module, num_experts: int, hidden: int, intermediate: int) -> None:
        ctx, s = layer.ctx, self.scheme
        if s.weight_form == "block" and intermediate % BLOCK:
            raise UnsupportedQuantization(
                f"{layer.prefix}: the experts' intermediate size on this rank, {intermediate}, is not a multiple of "
                f"{BLOCK}: the gate and up block scales cannot be packed into one w13 scale (fused_moe)")
        gate_up, down = layer.expert_shards(("gate", "up")), layer.expert_shards(("down",))
        register_weight(layer, "w13", ctx.empty(num_experts, 2 * intermediate, hidden, dtype=s.dtype),
                        loader=layer.load_expert, shards=gate_up)
        register_weight(layer, "w2", ctx.empty(num_experts, hidden, intermediate, dtype=s.dtype),
                        loader=layer.load_expert, shards=down)
        self._make_scale(layer, f"w13_{s.scale_name}", (num_experts,), 2 * intermediate, hidden,
                         loader=layer.load_expert, shards=gate_up)
        self._make_scale(layer, f"w2_{s.scale_name}", (num_experts,), hidden, intermediate,
                         loader=layer.load_expert, shards=down)
        if layer.ep:
            if s.act_quant is None:
                raise UnsupportedQuantization(f"{layer.prefix}: expert parallel runs quantized experts with "
                                              "activation quantization only (no W8A16 grouped GEMM)")
            self._bind_quant(layer)
            ctx.bind_op(layer, "_scaled_grouped_gemm", "scaled_grouped_gemm", dtype=s.dtype)
            ctx.bind_op(layer, "_silu_and_mul", "silu_and_mul")
        else:
            ctx.bind_op(layer, "_fused_moe", "fused_moe", activation="silu", weight_dtype=s.dtype, w13_scale=s.weight_form,
                        **({"act_quant": s.act_quant} if s.act_quant is not None else {}))

    def _split_sizes(self, layer, dim):
        return [layer.inter]

    def scales(self, layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """(w13 scale, w2 scale) of ``layer``."""
        name = self.scheme.scale_name
        return getattr(layer, f"w13_{name}"), getattr(layer, f"w2_{name}")

    def apply(self, layer: nn.Module, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        s13, s2 = self.scales(layer)
        return layer._fused_moe(x, layer.w13, layer.w2, weights, ids, w13_scale=s13, w2_scale=s2,
                                act_quant=self.scheme.act_quant, act_scale_fmt=self.scheme.scale_fmt)

    def apply_grouped(self, layer: nn.Module, x: torch.Tensor, group_ends: torch.Tensor) -> torch.Tensor:
        s13, s2 = self.scales(layer)
        q, scale = self._quantized(layer, x)
        h = layer._silu_and_mul(layer._scaled_grouped_gemm(q, layer.w13, scale, s13, group_ends, out_dtype=x.dtype))
        q, scale = self._quantized(layer, h)
        return layer._scaled_grouped_gemm(q, layer.w2, scale, s2, group_ends, out_dtype=x.dtype)
