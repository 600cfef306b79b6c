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
anything else is an error naming the layer.

A backend whose GEMM declines e4m3fn but runs e4m3fnuz (MI300: ``supports`` says which) gets the
e4m3fn weights as e4m3fnuz (``_qmath.e4m3fn_to_fnuz``): the parameters keep the checkpoint's dtype,
with 0x80 (-0) made +0 in place, and the layer runs a free fnuz view of them with doubled scales.
Activations are then quantized to e4m3fnuz (qmax 224), which gives the same bits as e4m3fn at 448.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from hetero.engine.quant._qmath import BLOCK, block_grid, dequantize, e4m3fn_to_fnuz
from hetero.engine.quant.base import LinearMethod, MoEMethod, QuantMethod, clamp_gate_up, register_weight
from hetero.engine.quant.config import UnsupportedQuantization

__all__ = ["Scheme", "ScaledLinearMethod", "ScaledMoEMethod"]

_GROUP_SIZE = {"group128": BLOCK, "token": None}
_FN, _FNUZ = torch.float8_e4m3fn, torch.float8_e4m3fnuz


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
        act = {"group128": f"{dtype} 1x128 groups", "token": f"{dtype} per token", None: "float (W8A16)"}[
            self.act_quant
        ]
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
            raise ValueError(
                f"{layer.prefix}: splitting over {count} ranks leaves {bad[0]} rows/columns per rank, "
                f"which cuts a {BLOCK}x{BLOCK} scale block (each rank's share must be a multiple of {BLOCK})"
            )
        return super().tp_part(layer, param, tensor, dim, index, count)

    def shard_range(self, layer, param, dim, start, size):
        if not self._is_block(param):
            return start, size
        if start % BLOCK:
            raise ValueError(
                f"{layer.prefix}: a packed shard starts at row {start}, inside a {BLOCK}-row scale block "
                f"(every packed part but the last must be a multiple of {BLOCK} rows)"
            )
        return start // BLOCK, -(-size // BLOCK)

    def _choose_run_dtype(self, layer: nn.Module, op: str, key: str, **static) -> torch.dtype:
        """Set and return ``layer.run_dtype``, the 8-bit dtype ``op`` computes in (its static ``key``): the
        checkpoint's, or e4m3fnuz where the backend declines e4m3fn for ``op`` and runs e4m3fnuz natively."""
        layer.run_dtype = self.scheme.dtype
        if self.scheme.act_quant is not None and self.scheme.dtype == _FN:
            static.setdefault("dtype", layer.ctx.dtype)
            ops = layer.ctx.ops
            declined = ops.native(op, **{**static, key: _FN})[1] is not None
            fnuz, why = ops.native(op, **{**static, key: _FNUZ})
            if declined and fnuz is not None and why is None:
                layer.run_dtype = _FNUZ
        return layer.run_dtype

    def _run_form(self, layer: nn.Module, names: tuple[str, ...]) -> None:
        """``layer.run_<name>`` for each weight and scale in ``names``: the parameters themselves, or their
        e4m3fnuz view and doubled scales (the -0 patterns cleared in place, so reloading stays correct)."""
        for name in names:
            weight, scale = getattr(layer, name), getattr(layer, self._scale_name(name))
            if layer.run_dtype == _FNUZ and weight.dtype == _FN:
                bits = weight.data.view(torch.int8)
                bits.masked_fill_(bits == -128, 0)
                weight, scale = e4m3fn_to_fnuz(weight.detach(), scale.detach())
            setattr(layer, f"run_{name}", weight)
            setattr(layer, f"run_{self._scale_name(name)}", scale)

    def _scale_name(self, weight: str) -> str:
        return self.scheme.scale_name if weight == "weight" else f"{weight}_{self.scheme.scale_name}"

    def _bind_quant(self, layer: nn.Module) -> None:
        if self.scheme.act_quant is not None:
            layer.ctx.bind_op(layer, "_quant", "quantize_activation", quant_dtype=layer.run_dtype)

    def _quantized(self, layer: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, scale = layer._quant(
            x, dtype=layer.run_dtype, group_size=_GROUP_SIZE[self.scheme.act_quant], scale_fmt=self.scheme.scale_fmt
        )[:2]
        return q, scale


class ScaledLinearMethod(_ScaledLoading, LinearMethod):
    """A Linear of 8-bit ``weight`` and its scale (named by the scheme)."""

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int) -> None:
        ctx, s = layer.ctx, self.scheme
        register_weight(
            layer,
            "weight",
            ctx.empty(out_features, in_features, dtype=s.dtype),
            loader=layer.load_weight,
            shards=layer.shard_ids,
            output_dim=0,
            input_dim=1,
        )
        self._make_scale(
            layer,
            s.scale_name,
            (),
            out_features,
            in_features,
            loader=layer.load_weight,
            shards=layer.shard_ids,
            output_dim=0,
            input_dim=1 if s.weight_form == "block" else None,
        )
        layer.dense = None
        if s.act_quant is None:
            ctx.bind_op(layer, "_gemm", "gemm")
        else:
            run = self._choose_run_dtype(layer, "scaled_gemm", "dtype")  # static dtype: the 8-bit operands
            self._bind_quant(layer)
            ctx.bind_op(layer, "_scaled_gemm", "scaled_gemm", dtype=run)

    def _split_sizes(self, layer, dim):
        return list(layer.out_splits) if dim == 0 else [layer.in_features]

    def _scale(self, layer: nn.Module) -> torch.Tensor:
        return getattr(layer, self.scheme.scale_name)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if self.scheme.act_quant is None:
            layer.dense = self.dense_weight(layer)
        else:
            self._run_form(layer, ("weight",))

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.scheme.act_quant is None:
            return layer._gemm(x, layer.dense, bias=bias)
        q, scale = self._quantized(layer, x)
        w_scale = getattr(layer, f"run_{self.scheme.scale_name}")
        return layer._scaled_gemm(q, layer.run_weight, scale, w_scale, bias=bias, out_dtype=x.dtype)

    def dense_weight(self, layer: nn.Module) -> torch.Tensor:
        return dequantize(layer.weight.detach(), self._scale(layer).detach(), layer.ctx.dtype)


class ScaledMoEMethod(_ScaledLoading, MoEMethod):
    """Stacked 8-bit experts: ``w13`` [E, 2I, H] (gate rows, then up rows), ``w2`` [E, H, I] and their scales
    ``w13_<scale>`` / ``w2_<scale>`` ([E, ceil(2I/128), ceil(H/128)] blocks or [E, 2I, 1] channels)."""

    activations = ("silu", "swiglu_clamp")

    def create_weights(self, layer: nn.Module, num_experts: int, hidden: int, intermediate: int) -> None:
        ctx, s = layer.ctx, self.scheme
        if s.weight_form == "block" and intermediate % BLOCK:
            raise UnsupportedQuantization(
                f"{layer.prefix}: the experts' intermediate size on this rank, {intermediate}, is not a multiple of "
                f"{BLOCK}: the gate and up block scales cannot be packed into one w13 scale (fused_moe)"
            )
        gate_up, down = layer.expert_shards(("gate", "up")), layer.expert_shards(("down",))
        register_weight(
            layer,
            "w13",
            ctx.empty(num_experts, 2 * intermediate, hidden, dtype=s.dtype),
            loader=layer.load_expert,
            shards=gate_up,
        )
        register_weight(
            layer,
            "w2",
            ctx.empty(num_experts, hidden, intermediate, dtype=s.dtype),
            loader=layer.load_expert,
            shards=down,
        )
        self._make_scale(
            layer,
            f"w13_{s.scale_name}",
            (num_experts,),
            2 * intermediate,
            hidden,
            loader=layer.load_expert,
            shards=gate_up,
        )
        self._make_scale(
            layer, f"w2_{s.scale_name}", (num_experts,), hidden, intermediate, loader=layer.load_expert, shards=down
        )
        if layer.ep:
            if s.act_quant is None:
                raise UnsupportedQuantization(
                    f"{layer.prefix}: expert parallel runs quantized experts with "
                    "activation quantization only (no W8A16 grouped GEMM)"
                )
            run = self._choose_run_dtype(layer, "scaled_grouped_gemm", "dtype")
            self._bind_quant(layer)
            ctx.bind_op(layer, "_scaled_grouped_gemm", "scaled_grouped_gemm", dtype=run)
            ctx.bind_op(layer, "_silu_and_mul", "silu_and_mul")
        else:
            static = dict(
                activation=layer.activation,
                w13_scale=s.weight_form,
                **({"act_quant": s.act_quant} if s.act_quant is not None else {}),
            )
            run = self._choose_run_dtype(layer, "fused_moe", "weight_dtype", **static)
            ctx.bind_op(layer, "_fused_moe", "fused_moe", weight_dtype=run, **static)

    def _split_sizes(self, layer, dim):
        return [layer.inter]

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        self._run_form(layer, ("w13", "w2"))

    def scales(self, layer: nn.Module, *, run: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(w13 scale, w2 scale) parameters of ``layer``; ``run``: as the layer runs them (doubled for e4m3fnuz)."""
        pre = "run_" if run else ""
        return getattr(layer, f"{pre}w13_{self.scheme.scale_name}"), getattr(layer, f"{pre}w2_{self.scheme.scale_name}")

    def apply(self, layer: nn.Module, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        s13, s2 = self.scales(layer, run=True)
        clamp = {} if layer.activation == "silu" else dict(activation=layer.activation, limit=layer.limit)
        return layer._fused_moe(
            x,
            layer.run_w13,
            layer.run_w2,
            weights,
            ids,
            w13_scale=s13,
            w2_scale=s2,
            act_quant=self.scheme.act_quant,
            act_scale_fmt=self.scheme.scale_fmt,
            **clamp,
        )

    def apply_grouped(self, layer: nn.Module, x: torch.Tensor, group_ends: torch.Tensor) -> torch.Tensor:
        s13, s2 = self.scales(layer, run=True)
        q, scale = self._quantized(layer, x)
        gate_up = layer._scaled_grouped_gemm(q, layer.run_w13, scale, s13, group_ends, out_dtype=x.dtype)
        if layer.activation == "swiglu_clamp":
            gate_up = clamp_gate_up(gate_up, layer.limit)
        h = layer._silu_and_mul(gate_up)
        q, scale = self._quantized(layer, h)
        return layer._scaled_grouped_gemm(q, layer.run_w2, scale, s2, group_ends, out_dtype=x.dtype)
