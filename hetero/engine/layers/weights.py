"""Copying checkpoint tensors into parameters, and naming modules by their checkpoint prefix."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["copy_checked", "head_param", "is_plain_float", "join_prefix"]


def is_plain_float(dtype: torch.dtype) -> bool:
    """A floating dtype of 16 bits or more: one value per element, no scale needed to read it.

    float8 (and packed float4) values only mean something with their scales, so they are
    quantized data, as are integer tensors.
    """
    return dtype.is_floating_point and dtype.itemsize >= 2


def copy_checked(param: torch.Tensor, tensor: torch.Tensor, what: str) -> None:
    """Copy ``tensor`` into ``param``, or raise a ValueError naming what differs.

    Shapes must be equal. Dtypes must be equal, or both plain floats (then the value is
    cast): a quantized tensor (float8, int8, packed uint8, ...) is never cast into a float
    parameter, since without its scale the numbers would be silently wrong.
    """
    if tensor.dtype != param.dtype and not (is_plain_float(tensor.dtype) and is_plain_float(param.dtype)):
        raise ValueError(
            f"{what}: the checkpoint tensor is {tensor.dtype}, the parameter expects {param.dtype}; "
            "a quantized tensor loads only into a layer whose quantization method creates "
            "parameters of its dtype (is the checkpoint's quantization_config supported?)"
        )
    if tuple(param.shape) != tuple(tensor.shape):
        raise ValueError(f"{what}: expected shape {tuple(param.shape)}, the checkpoint has {tuple(tensor.shape)}")
    param.data.copy_(tensor.to(param.dtype))


def join_prefix(prefix: str, name: str) -> str:
    """The checkpoint prefix of child ``name`` of the module at ``prefix`` ("" is the root)."""
    return f"{prefix}.{name}" if prefix else name


def head_param(per_rank: int, rank: int, ranks: int, device: torch.device | str, what: str) -> nn.Parameter:
    """A float32 parameter of one value per attention head (sinks), this rank's ``per_rank`` of them: it loads
    part ``rank`` of the checkpoint's ``[per_rank * ranks]`` tensor, any other shape a ValueError naming ``what``."""
    param = nn.Parameter(torch.empty(per_rank, dtype=torch.float32, device=device), requires_grad=False)

    def load(p: nn.Parameter, tensor: torch.Tensor, shard: object = None) -> None:
        if tuple(tensor.shape) != (per_rank * ranks,):
            raise ValueError(
                f"{what}: expected one value per attention head ({per_rank * ranks},), "
                f"the checkpoint has {tuple(tensor.shape)}"
            )
        copy_checked(p, tensor.narrow(0, rank * per_rank, per_rank), what)

    param.weight_loader, param.shards = load, (None,)
    return param
