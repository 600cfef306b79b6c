"""What a quantization method is: the object a Linear or a FusedMoE delegates its weights to.

A layer holds one method (``layer.quant_method``), chosen for it by a ``QuantConfig``
from its checkpoint prefix. The method

- creates the layer's weight parameters (``create_weights``): a format may register
  more than one (an fp8 weight and its block scales), each carrying ``weight_loader``
  and ``shards`` as every engine parameter does, and binds the ops ``apply`` calls;
- decides how a checkpoint tensor is cut for a parameter: this rank's share of it
  (``tp_part``) and where a packed shard lies in it (``shard_range``), so a
  block-scale tensor is cut in block units while its weight is cut in elements;
- fixes the weights up once every tensor is loaded (``process_weights_after_loading``,
  run by the loader's post-load pass after each load);
- runs the layer (``apply``).

State lives on the layer (parameters, derived tensors); a method holds only its
format's settings, so one object could serve many layers.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import nn

__all__ = ["QuantMethod", "LinearMethod", "MoEMethod", "register_weight", "clamp_gate_up"]


def clamp_gate_up(gate_up: torch.Tensor, limit: float) -> torch.Tensor:
    """``[gate | up]`` clamped as ``swiglu_clamp`` takes them, ``min(gate, l)`` and ``clamp(up, -l, l)``, so that
    ``silu_and_mul`` of the result is that activation (the expert-parallel paths and DeepSeek-V4's shared expert)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.cat([gate.clamp(max=limit), up.clamp(-limit, limit)], dim=-1)


def register_weight(
    layer: nn.Module, name: str, data: torch.Tensor, *, loader: Callable, shards: Sequence[Any] = (None,), **attrs: Any
) -> nn.Parameter:
    """Register ``data`` as parameter ``name`` of ``layer`` with its ``weight_loader`` and ``shards``.

    ``attrs`` become attributes of the parameter; a Linear reads ``output_dim`` (the
    dimension holding its output features: split by column-parallel layers, where packed
    shards lie) and ``input_dim`` (split by row-parallel layers); a dimension the
    parameter lacks is None or absent.
    """
    param = nn.Parameter(data, requires_grad=False)
    param.weight_loader, param.shards = loader, tuple(shards)
    for key, value in attrs.items():
        setattr(param, key, value)
    layer.register_parameter(name, param)
    return param


class QuantMethod:
    """The loading rules every method shares; element-wise here, overridden per parameter by block formats."""

    def tp_part(
        self, layer: nn.Module, param: nn.Parameter, tensor: torch.Tensor, dim: int, index: int, count: int
    ) -> torch.Tensor:
        """Part ``index`` of ``count`` equal parts of checkpoint ``tensor`` along ``dim`` (this rank's share).

        ``param`` is the parameter it will fill: a block-scale tensor is split in blocks,
        which needs every part's boundary on a block boundary.
        """
        n = tensor.shape[dim]
        if n % count:
            raise ValueError(
                f"the checkpoint tensor of shape {tuple(tensor.shape)} does not split into {count} "
                f"equal parts along dimension {dim}"
            )
        size = n // count
        return tensor.narrow(dim, index * size, size)

    def shard_range(self, layer: nn.Module, param: nn.Parameter, dim: int, start: int, size: int) -> tuple[int, int]:
        """(start, size) along ``dim`` of ``param`` that hold the layer's elements [start, start + size).

        The layer counts in elements of its weight (q, k, v rows of qkv_proj; gate and up
        rows of w13); a block-scale parameter holds one entry per block of them.
        """
        return start, size

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Derive what ``apply`` needs from the loaded parameters (repacking, dequantizing, ...).

        Runs after every ``load_weights``, so it must start from the parameters as loaded.
        """


class LinearMethod(QuantMethod):
    """The weights and the product of a Linear: ``y = x @ W.T (+ bias)``. The bias is the layer's (never quantized)."""

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int) -> None:
        """Register the layer's weight parameter(s) for a [out_features, in_features] weight on this rank.

        ``layer.load_weight`` is the loader to give them, ``layer.shard_ids`` their shards.
        """
        raise NotImplementedError

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x [T, in] -> [T, out]`` with ``bias`` added (None: none)."""
        raise NotImplementedError

    def dense_weight(self, layer: nn.Module) -> torch.Tensor:
        """The weight as a plain float [out, in] tensor (dequantized if need be), for layers that
        reshape it themselves (MLA's absorbed path)."""
        raise NotImplementedError


class MoEMethod(QuantMethod):
    """The expert weights of a FusedMoE and the expert computation (routing and communication are the layer's)."""

    def create_weights(self, layer: nn.Module, num_experts: int, hidden: int, intermediate: int) -> None:
        """Register the stacked expert weights of this rank's ``num_experts`` experts (gate and up rows of
        ``intermediate`` each, then down), with ``layer.load_expert`` as loader and ``layer.expert_shards``."""
        raise NotImplementedError

    def apply(self, layer: nn.Module, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Tensor parallel: ``x [T, H]`` through every expert ``ids [T, k]`` picks, summed with ``weights``
        (this rank's partial sum, before the all-reduce)."""
        raise NotImplementedError

    def apply_grouped(self, layer: nn.Module, x: torch.Tensor, group_ends: torch.Tensor) -> torch.Tensor:
        """Expert parallel: rows of ``x`` grouped by local expert (``group_ends``) through their expert's MLP."""
        raise NotImplementedError
